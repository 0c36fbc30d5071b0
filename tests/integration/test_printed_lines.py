"""What a script prints is what plain `python` prints (#84): in one process its lines byte for byte, its progress
bars' numbers included, apart from their timings and distrain's own lines; under ranks the script's progress from
the chief only, and distrain's lines each on a line of its own, never inside a progress bar's."""

import re
import subprocess

import pytest

from helpers import DISTRAIN, ROOT, clean_env, keras_env, run

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "progress_bars.py"
# a bar's elapsed time and time per step (the backspaces and spaces that erase the bar before it, as many as that
# one was wide with its timings, are dropped too)
TIMINGS = re.compile(r"\d+(\.\d+)?(ms|us|s)(/step)?")
BAR = re.compile(r"━|\[=")  # Keras 3's and tf_keras' progress bars (fit's, evaluate's and predict's)


def stdout_of(command: list[str], env: dict, cwd) -> str:  # noqa: ANN001
    out = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return shown(out.stdout)


def shown(output: str) -> str:
    """What a terminal shows of `output`, its timings masked: a bar redrawn with carriage returns shows its last
    drawing (which steps a bar draws in between depends on the time it took: Keras redraws every 0.05 s)."""
    masked = TIMINGS.sub("T", output).replace("\x08", "")
    return "\n".join(line.split("\r")[-1].rstrip(" ") for line in masked.split("\n"))


def settled(shown_output: str) -> tuple[str, dict[tuple[int, str], str]]:
    """`shown_output` with each bar's last drawing only, and its drawings before by (bar, step). Into a file a bar
    draws a line of its own at each step 0.05 s after its last drawing, so which steps it draws depends on the
    machine's load, under plain python too (its last step twice or once); what a drawing at a given step shows
    does not."""
    lines = shown_output.split("\n")
    kept, drawn, bar = [], {}, 0
    for index, line in enumerate(lines):
        redrawn = index + 1 < len(lines) and BAR.search(lines[index + 1])
        if BAR.search(line) and redrawn:
            drawn[(bar, line.split()[0])] = line
            continue
        bar += 1
        kept.append(line)
    return "\n".join(kept), drawn


@pytest.mark.parametrize("family", ["keras3", "legacy"])
def test_one_process_prints_plain_pythons_lines_progress_bars_included(family, tmp_path):
    """Before #84, a script without `verbose` whose output is a file printed one line an epoch under distrain,
    where Keras 3.3's progress bar shows other numbers (accuracy 0.1652 for python's 0.1145)."""
    args = [str(SCRIPT), "best.keras", "--keras", family]
    legacy = {"TF_USE_LEGACY_KERAS": "1"} if family == "legacy" else {}
    (tmp_path / "plain").mkdir()
    (tmp_path / "distrain").mkdir()
    plain = stdout_of(["python", *args], clean_env(TF_CPP_MIN_LOG_LEVEL="2", **legacy), tmp_path / "plain")
    distrained = stdout_of([DISTRAIN, "run", *args], keras_env(family), tmp_path / "distrain")
    assert BAR.search(plain) and "Epoch 2/2" in plain, plain[-2000:]
    (plain_lines, plain_drawn), (distrain_lines, distrain_drawn) = settled(plain), settled(distrained)
    assert distrain_lines == plain_lines
    both = plain_drawn.keys() & distrain_drawn.keys()
    assert both, plain[-2000:]  # a bar's first step is always drawn
    assert {step: distrain_drawn[step] for step in both} == {step: plain_drawn[step] for step in both}


def test_under_ranks_the_chief_alone_prints_progress_and_distrains_lines_start_a_line(tmp_path):
    out = subprocess.run([DISTRAIN, "launch", "-n", "2", str(SCRIPT), str(tmp_path / "best.keras")],
                         env=keras_env("keras3"), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=300)
    log = out.stdout.decode()  # not text=True: its universal newlines would cut a bar's redrawings into lines
    assert out.returncode == 0, log[-3000:]
    lines = log.split("\n")
    assert [line for line in lines if line.startswith("[0/2]") and BAR.search(line)], log[-3000:]
    assert not [line for line in lines if line.startswith("[1/2]") and BAR.search(line)], log[-3000:]
    assert len([line for line in lines if line.startswith("[1/2] evaluate ")]) == 1, log[-3000:]
    saved = [line for line in lines if "distrain: saved model to" in line]
    assert saved and all(re.match(r"\[0/2\] distrain: saved model to", line) for line in saved), saved


def test_in_one_process_distrains_lines_start_a_line_of_their_own(tmp_path):
    out = run([DISTRAIN, "run", str(SCRIPT), str(tmp_path / "best.keras")], env=keras_env("keras3"), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    saved = [line for line in out.stdout.splitlines() if "distrain: saved model to" in line]
    assert saved and all(line.startswith("[0/1] distrain: saved model to") for line in saved), out.stdout[-3000:]
