"""A script whose data is on a filesystem the container does not have (test_bad_input's unbound-data row)."""

with open("/scratch-not-bound/me/data/train.csv") as handle:
    print(handle.readline())
