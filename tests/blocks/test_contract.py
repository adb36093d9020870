"""The Block contract suite (``blocks.contract``) over every registered block and example config.

Parametrised from the registry: registering a block adds its cases here without editing this file.
"""
import pytest
import torch

import blocks
from blocks import contract

CASES = contract.cases()
IDS = [c.id for c in CASES]
# Cases whose block has a `mode` field (a reference path to compare against); every linear
# family must have one.
MODE_CASES = [c for c in CASES if contract.has_mode(c)]


def test_every_registered_block_has_cases():
    assert {c.name for c in CASES} == set(blocks.names())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pieces_equal_one_pass(case):
    contract.check_pieces(case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decode_equals_one_pass(case):
    contract.check_decode(case)


@pytest.mark.parametrize("case", MODE_CASES, ids=[c.id for c in MODE_CASES])
def test_recurrent_equals_chunk(case):
    contract.check_recurrent(case)


def test_every_linear_family_has_a_reference_mode():
    assert set(blocks.names()) - {"softmax"} <= {c.name for c in MODE_CASES}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_state_bytes_exact(case):
    contract.check_state_bytes(case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_state_not_modified(case):
    contract.check_state_immutable(case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_batch_rows_independent(case):
    contract.check_batch_independent(case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_parameter_gets_gradient(case):
    contract.check_params_receive_grad(case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_num_params(case):
    contract.check_num_params(case)


BAD = contract.bad_config_cases()


@pytest.mark.parametrize("name,config,field", BAD, ids=[f"{n}-{f}-{i}" for i, (n, _, f) in enumerate(BAD)])
def test_bad_config_names_field(name, config, field):
    contract.check_bad_config(name, config, field)


@pytest.mark.parametrize("name", blocks.names())
def test_block_declares_bad_configs_and_letter(name):
    contract.check_declares_bad_configs(name)
    contract.check_letter(name)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_contract_on_cuda(case):
    """The stateful checks again on CUDA, where the ops dispatch to blocks.kernels and SDPA backends."""
    contract.check_pieces(case, "cuda")
    contract.check_decode(case, "cuda")
    contract.check_state_bytes(case, "cuda")
    contract.check_state_immutable(case, "cuda")
    if contract.has_mode(case):
        contract.check_recurrent(case, "cuda")
