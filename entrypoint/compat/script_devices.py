"""A script's own logical device configuration, where distrain started TensorFlow before the script ran.

TensorFlow's "Distributed input" and custom-training tutorials split the CPU into logical devices first
(`tf.config.set_logical_device_configuration(cpu, [LogicalDeviceConfiguration()] * 2)`) and then build a
`MirroredStrategy` over them. Under distrain's MWM and Horovod, TensorFlow is started before the script (the
strategy's server, Horovod's ranks), and TensorFlow refuses the call: "Virtual devices cannot be modified after
being initialized". Plain python's numbers do not depend on the split: its replicas share each global batch, as
distrain's ranks do (the script's `MirroredStrategy` is distrain's, compat/adopt.py). So a configuration that can
no longer be applied is skipped with one line; one TensorFlow can still apply (or refuses for another reason)
goes through as under plain python. Not installed under `single`, where distrain starts nothing before the script.
"""

from __future__ import annotations

from typing import Any

from ..log import get as log
from . import registry

TOO_LATE = "cannot be modified after being initialized"  # TensorFlow's RuntimeError for a configuration too late
_CALLS = ("tensorflow:config.set_logical_device_configuration",
          "tensorflow:config.experimental.set_virtual_device_configuration")


def install(mode: str) -> None:
    """Make the script's logical device configuration calls skip, with one line, what TensorFlow no longer takes."""
    warned: list[bool] = []

    def skipping(original: Any) -> Any:
        def configure(device: Any, logical_devices: Any) -> None:
            try:
                return original(device, logical_devices)
            except RuntimeError as error:
                if TOO_LATE not in str(error):
                    raise
                if not warned:
                    warned.append(True)
                    log().warning(f"the script configures {getattr(device, 'name', device)} as "
                                  f"{len(logical_devices or [])} logical device(s) (set_logical_device_configuration) "
                                  f"after distrain's {mode} started TensorFlow: skipped, one device per rank kept (its "
                                  f"strategy is distrain's; a memory limit in it is not applied)")
                return None

        return configure

    for spelled in _CALLS:
        registry.replace("script_devices.logical_configuration", spelled, skipping)
