"""compile's jit_compile with several ranks (fit/compile_arguments._xla_where_it_works): what each mode and device
gets, without TensorFlow (a stand-in for tf.config). The CPU refusal runs for real in integration/test_bad_input.py."""

from types import SimpleNamespace

import pytest

from entrypoint.engines import Engine
from entrypoint.engines.horovod import HorovodEngine
from entrypoint.engines.strategy import StrategyEngine
from entrypoint.errors import EnvironmentProblem
from entrypoint.fit.compile_arguments import _xla_where_it_works
from entrypoint.keras_family import KERAS3, TF_KERAS

pytestmark = pytest.mark.unit


def engine(mode: str, gpus: int, size: int = 2, family=KERAS3):  # noqa: ANN001, ANN201
    """The mode's engine (engines/) over a stand-in plan, Horovod and tf.config."""
    devices = [SimpleNamespace(device_type="GPU")] * gpus
    tf = SimpleNamespace(config=SimpleNamespace(list_physical_devices=lambda kind=None: devices))
    plan = SimpleNamespace(mode=mode, family=family, is_chief=True, size=size, rank=0)
    hvd = SimpleNamespace(size=lambda: size, rank=lambda: 0) if mode == "horovod" else None
    kind = {"horovod": HorovodEngine, "mwm": StrategyEngine, "single": Engine}[mode]
    return kind(plan, hvd=hvd, tf=tf)


def compiled(mode: str, gpus: int, jit, **kwargs) -> dict:  # noqa: ANN001
    arguments = {} if jit == "default" else {"jit_compile": jit}
    _xla_where_it_works(engine(mode, gpus, **kwargs), arguments)
    return arguments


def test_keras3s_auto_is_xla_off_under_horovod_on_gpus_and_left_alone_elsewhere():
    assert compiled("horovod", gpus=1, jit="default") == {"jit_compile": False}  # Keras would turn XLA on
    assert compiled("horovod", gpus=1, jit="auto") == {"jit_compile": False}
    assert compiled("horovod", gpus=0, jit="default") == {}  # Keras leaves XLA off on CPUs itself
    assert compiled("horovod", gpus=1, jit="default", family=TF_KERAS) == {}  # tf_keras has no "auto"
    assert compiled("mwm", gpus=1, jit="default") == {}  # a strategy: Keras leaves XLA off
    assert compiled("single", gpus=1, jit=True) == {"jit_compile": True}
    assert compiled("horovod", gpus=1, jit=True, size=1) == {"jit_compile": True}  # one rank: no all-reduce


def test_jit_compile_true_is_refused_under_horovod_and_under_mwm_on_cpus_only():
    for mode, gpus in (("horovod", 1), ("horovod", 0), ("mwm", 0)):
        with pytest.raises(EnvironmentProblem, match=f"jit_compile=True\\) under {mode} with 2 ranks cannot work"):
            compiled(mode, gpus, jit=True)
    assert compiled("mwm", gpus=1, jit=True) == {"jit_compile": True}  # NCCL: selftest proves it on the GPUs
