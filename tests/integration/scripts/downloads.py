"""A script that downloads its data as keras-io's examples do: `keras.utils.get_file(..., extract=True)` into the
cache, then reads every extracted file (what `text_dataset_from_directory` does next). Every rank runs it."""
import hashlib
import os
import sys

import keras

origin, cache = sys.argv[1], sys.argv[2]
digests = []
for _ in range(3):  # a script calling it again (each fold of a k-fold) extracts again
    path = keras.utils.get_file("texts.tar.gz", origin=origin, extract=True, cache_dir=cache)
    folder = os.path.join(path if os.path.isdir(path) else os.path.dirname(path), "texts")
    if not os.path.isdir(folder):  # Keras 3.15 extracts into "<fname>_extracted"
        folder = os.path.join(path, "texts") if os.path.isdir(path) else folder
    names = sorted(os.listdir(folder))
    digest = hashlib.sha256()
    for name in names:
        with open(os.path.join(folder, name), "rb") as handle:
            digest.update(handle.read())
    digests.append(f"{len(names)}x{digest.hexdigest()[:12]}")
print("RESULT files=" + ",".join(digests), flush=True)
