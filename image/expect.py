"""expect.py "tensorflow=2.17 keras=3.3 tf_keras=2.17 horovod=0.28.1 cuda nccl" - the image's build checks that
its base carries what the README says it carries (install.sh runs it for every flavour; a failure fails the build,
not a user's first run). NAME=PREFIX: that module's version starts with PREFIX; `cuda`: TensorFlow is a CUDA build;
`nccl`: Horovod has NCCL. Prints one line per check, the versions found."""

import importlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except ImportError:
        return "absent"


def check(item: str) -> tuple[str, bool]:
    if item == "cuda":
        import tensorflow as tf

        return "TensorFlow is a CUDA build", tf.test.is_built_with_cuda()
    if item == "nccl":
        import horovod.tensorflow as hvd

        return "Horovod has NCCL", bool(hvd.nccl_built())
    name, _, prefix = item.partition("=")
    found = version(name)
    return f"{name} {found} (expected {prefix}.*)", found == prefix or found.startswith((prefix + ".", prefix + "+"))


def main(expected: str) -> int:
    results = [check(item) for item in expected.split()]
    for said, ok in results:
        print(f"image/expect.py: {'ok' if ok else 'FAILED'}: {said}")
    if all(ok for _, ok in results):
        return 0
    print("image/expect.py: the base is not the one this image is documented to be: use the base the README names, "
          "or state what yours carries (build argument EXPECT)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
