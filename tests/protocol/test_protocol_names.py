"""The protocol's names are defined once, keep their wire values, and the server side
stands without the client package."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedveil.privacy.secagg import Stage as SecAggStage
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.flower_codec import KINDS, from_content, message_type, to_content
from fedveil.protocol.kinds import (
    SECAGG_KINDS,
    TRAINING_KINDS,
    ErrorCode,
    Kind,
    Stage,
    stage_of,
)

# The wire values devices of earlier versions send and expect: never to change.
WIRE_KINDS = [
    "hello",
    "train",
    "evaluate",
    "secagg.advertise",
    "secagg.share_keys",
    "secagg.masked_input",
    "secagg.consistency",
    "secagg.unmask",
]


def test_kinds_keep_their_wire_values_and_flower_types():
    assert [k.value for k in Kind] == WIRE_KINDS == KINDS
    assert [k.value for k in SECAGG_KINDS] == WIRE_KINDS[3:]
    assert message_type(Kind.HELLO) == message_type("hello") == "query.hello"
    assert message_type(Kind.EVALUATE) == "evaluate.evaluate"
    assert message_type(Kind.SECAGG_MASKED_INPUT) == "train.secagg_masked_input"
    assert set(TRAINING_KINDS) == {"train", "secagg.masked_input"}
    assert (ErrorCode.BAD_MESSAGE, ErrorCode.CLIENT_FAILURE) == (4001, 4002)


def test_stages_are_one_enum_shared_with_the_protocol_state_machines():
    assert SecAggStage is Stage
    assert Kind.secagg(Stage.UNMASK) is Kind.SECAGG_UNMASK
    assert stage_of("secagg.share_keys") is Stage.SHARE_KEYS
    assert stage_of("secagg.nonsense") is None and stage_of("train") is None


def test_names_print_as_their_wire_values():
    # A plain (str, Enum) prints "Kind.TRAIN" on Python 3.11+: logs and errors would change.
    assert f"{Kind.TRAIN}" == str(Kind.TRAIN) == "train"
    assert f"{Stage.MASKED_INPUT:>14}" == "  masked_input"
    assert {"train": 1}[Kind.TRAIN] == 1


def test_an_envelope_carries_the_plain_kind_on_the_wire():
    env = Envelope(Kind.TRAIN, 3, {F.SEED: 7}, {})
    assert type(env.kind) is str and env.kind == "train"
    with pytest.raises(MessageError, match=r"^train message: missing field 'lr'"):
        env.get(F.LR, float)
    back = from_content(to_content(env))
    assert (back.kind, back.round, back.config) == ("train", 3, {"seed": 7})


@pytest.mark.procs
def test_server_and_coordinator_import_nothing_from_the_client_package():
    code = (
        "import sys\n"
        "import fedveil.server.engine.secagg_channel, fedveil.server.engine.pipeline\n"
        "import fedveil.server.engine.rounds\n"
        "import fedveil.server.coordinator.superlink\n"
        "print(sorted(m for m in sys.modules if m.startswith('fedveil.client')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_fab_names_the_clientapp_the_device_runs():
    from fedveil.client.edge import device_app
    from fedveil.protocol.deployment import CLIENTAPP_REF
    from fedveil.server.coordinator.superlink import fab_pyproject

    module, attr = CLIENTAPP_REF.split(":")
    assert module == device_app.__name__ and hasattr(device_app, attr)
    assert f'clientapp = "{CLIENTAPP_REF}"' in fab_pyproject()
