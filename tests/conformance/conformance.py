"""Reading and judging the conformance scenarios' lines (scripts/keras_surface.py): each rank's results, compared
with plain `python`'s under the contracts of tests/README.md's conformance table."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from helpers import ROOT, clean_env, run

SCRIPT = ROOT / "tests" / "conformance" / "scripts" / "keras_surface.py"
# every scenario of the script, in its order (read from its source: importing it imports TensorFlow)
SCENARIOS = tuple(re.findall(r"^@scenario\ndef (\w+)", SCRIPT.read_text(), re.MULTILINE))
# a rank's tag (distrain launch's [0/2], mpirun's [1,0]<stdout>:), then the line: mpirun's --tag-output can glue
# one rank's line onto another's, so lines are found anywhere, a value ending where a tag begins
LINE = re.compile(r"(?:\[(\d+/\d+|\d+,\d+)\](?:<std\w+>:)? ?)*CONFORM name=(\w+) ((?:\w+=(?:(?!\[\d+,\d+\]<)\S)+ ?)*)")
# several ranks sum in another order: relative differences of float32 sums over 2 ranks and a few epochs
RELATIVE_TOLERANCE = 1e-4
# ... and where the compute is float16 (float32 variables, loss scaling): its rounding, not 1e-4, bounds the sums
SCENARIO_TOLERANCE = {"mixed_precision": 1e-3}
NOT_NUMBERS = {"status", "seconds", "files", "csv_rows"}
# compared between the ranks only: each rank's own clock decides where the script stops (the ranks agree on one)
RANKS_ONLY = {"stop_training_on_one_rank"}


@dataclass(frozen=True)
class Scenario:
    name: str
    values: dict[str, str]

    @property
    def ok(self) -> bool:
        return self.values.get("status") == "ok"


def scenarios(output: str) -> list[dict[str, Scenario]]:
    """Each rank's scenarios, in the order its lines came."""
    by_rank: dict[str, dict[str, Scenario]] = {}
    for found in LINE.finditer(output):
        values = dict(kv.split("=", 1) for kv in found[3].split() if "=" in kv)
        by_rank.setdefault(found[1] or "", {})[found[2]] = Scenario(found[2], values)
    return list(by_rank.values())


def plain_python(out_dir: Path, family: str, *names: str) -> dict[str, Scenario]:
    """The reference: the scenarios under plain `python`, no distrain."""
    env = clean_env(TF_CPP_MIN_LOG_LEVEL="2", **({"TF_USE_LEGACY_KERAS": "1"} if family == "legacy" else {}))
    out = run(["python", str(SCRIPT), str(out_dir), "--keras", family, *names], env=env, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:]
    [reference] = scenarios(out.stdout)
    failed = {name: s.values["status"] for name, s in reference.items() if not s.ok}
    assert not failed, f"plain python fails: {failed}"
    return reference


def differences(got: Scenario, want: Scenario, exact: bool) -> list[str]:
    """What differs between a scenario's result and the reference's: [] when they agree."""
    if not got.ok:
        return [f"{got.name}: {got.values['status']}"]
    wrong = []
    for key, expected in want.values.items():
        value = got.values.get(key)
        if key in ("status", "seconds"):
            continue
        if key in NOT_NUMBERS or exact:
            if value != expected:
                wrong.append(f"{got.name}.{key}: {value} where plain python has {expected}")
            continue
        pairs = list(zip(_floats(value), _floats(expected)))
        if value is None or len(pairs) != len(_floats(expected)) or any(
                abs(a - b) > SCENARIO_TOLERANCE.get(got.name, RELATIVE_TOLERANCE) * max(1.0, abs(b)) for a, b in pairs):
            wrong.append(f"{got.name}.{key}: {value} where plain python has {expected}")
    return wrong


def _floats(text: str | None) -> list[float]:
    return [float(v) for v in text.split(",")] if text else []


def judge(output: str, reference: dict[str, Scenario], ranks: int, exact: bool = False) -> dict[str, list[str]]:
    """Per scenario, what is wrong in this launch's output: every rank as plain python (the RANKS_ONLY ones: the
    ranks as one another), every scenario reported by every rank."""
    found = scenarios(output)
    verdicts: dict[str, list[str]] = {name: [] for name in reference}
    if len(found) != ranks:
        return {name: [f"{len(found)} ranks reported, not {ranks}"] for name in reference}
    for name, want in reference.items():
        for rank in found:
            got = rank.get(name)
            if got is None:
                verdicts[name].append(f"{name}: not reported (the launch ended before it)")
            elif name in RANKS_ONLY:
                first = found[0].get(name, got)
                verdicts[name] += differences(got, first, exact=True) if first.ok else [first.values["status"]]
            else:
                verdicts[name] += differences(got, want, exact)
    return verdicts
