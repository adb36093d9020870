"""Running trials: slots of GPUs (or CPU gloo groups), one DeepSpeed-launched process group per
trial, DeepSpeed configs, fault classification, reaping trials of dead workers, hostfiles.

    slots.plan_slots(gpus, gpus_per_trial, cpu_slots) -> list[Slot]
    process.start_trial(spec_path, config_path, out_path, slot, log_path, timeout_s=...) -> TrialProcess
    faults.classify(returncode, record, log_text, timed_out) -> (status, reason)
    reaper.reap_stale_trials(study) -> list[FrozenTrial]
    dsconfig.ds_config_for_slot(slot, override) -> dict
"""
