"""The slot flags shared by ``archsearch launch`` and ``archsearch worker``.

    --gpus 0,1,2,3      which GPUs (physical ids; default: all visible; ``none`` = CPU only)
    --gpus-per-trial k  GPUs per trial (data parallel inside the trial); on CPU: gloo processes per trial
    --slots N           concurrent trials on a machine without GPUs
    --ds-config FILE    DeepSpeed JSON (ZeRO stage, bf16, accumulation) instead of launch/configs/ defaults
    --hostfile FILE     one trial spans every host of a DeepSpeed hostfile
"""
from __future__ import annotations

import argparse

from launch.slots import Slot, parse_gpu_list, plan_slots


def add_slot_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("slots (where trials run)")
    g.add_argument("--gpus", default=None, metavar="IDS",
                   help="GPU ids to use, e.g. 0,1,2,3 (default: all visible; 'none' = CPU)")
    g.add_argument("--gpus-per-trial", type=int, default=1, metavar="K",
                   help="GPUs per trial, giving G/K concurrent trials (on CPU: gloo processes per trial)")
    g.add_argument("--slots", type=int, default=1, metavar="N",
                   help="concurrent CPU trials when there is no GPU (default 1)")
    g.add_argument("--ds-config", default=None, metavar="FILE",
                   help="DeepSpeed config JSON for the trials (ZeRO stage, bf16); default: launch/configs/")
    g.add_argument("--hostfile", default=None, metavar="FILE",
                   help="DeepSpeed hostfile: each trial spans all its hosts (multi-node trials)")


def slots_from_args(args: argparse.Namespace) -> list[Slot]:
    """Plan the slots the flags describe (UserError on bad values)."""
    return plan_slots(parse_gpu_list(args.gpus), args.gpus_per_trial, args.slots,
                      hostfile=args.hostfile, ds_config=args.ds_config)
