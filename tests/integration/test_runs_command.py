"""`distrain runs` (entrypoint/runs_view.py): a finished, a stopped, a failed and a live run under one output
directory, each with its state, position and the command that resumes it; that command, executed, resumes the
run; `rm` refuses the live one and deletes the others."""

import json
import os
import re
import subprocess
import time

from helpers import DISTRAIN, ROOT, Watched, clean_env, run

EXACT = str(ROOT / "tests" / "integration" / "scripts" / "exact_resume.py")
SLOW = str(ROOT / "tests" / "integration" / "scripts" / "slow_steps.py")


def runs(output, *args: str) -> list[dict] | str:
    out = run([DISTRAIN, "runs", "--dir", str(output), *args], env=clean_env())
    assert out.returncode == 0, out.stdout
    return json.loads(out.stdout) if "--json" in args else out.stdout



def test_runs_lists_each_runs_state_and_the_command_that_resumes_it(tmp_path):
    output = tmp_path / "output"
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(output), DISTRAIN_CHECKPOINT_EVERY="2")
    for name in ("finished", "stopped"):
        (tmp_path / name).mkdir()
    # a job's signal lead shorter than a stop needs (the 2-s agreement alone): one warning, however many epochs
    finished = run([DISTRAIN, "run", EXACT, "--out", str(tmp_path / "finished"), "--epochs", "2"],
                   env={**env, "DISTRAIN_STOP_LEAD": "1"})
    assert finished.returncode == 0 and finished.stdout.count("a stop now needs up to") == 1, finished.stdout[-3000:]
    stopped = run([DISTRAIN, "run", EXACT, "--out", str(tmp_path / "stopped")], env={**env, "STOP_AT": "2:3"})
    assert stopped.returncode == 75, stopped.stdout[-2000:]
    failing = tmp_path / "failing.py"
    failing.write_text(  # an error inside a tf.function: TensorFlow's message is a dozen lines of where it was defined
        "import os\nimport tensorflow as tf\n"
        "tf.function(lambda: tf.py_function(lambda: float(os.environ['IDS_LOG']), [], tf.float32))()\n")
    assert run([DISTRAIN, "run", str(failing)], env=env).returncode == 1
    live = Watched([DISTRAIN, "run", SLOW, "--step-seconds", "0.5", "--epochs", "50"], env)
    try:
        deadline = time.monotonic() + 60  # until it has started (its record is written before TensorFlow loads)
        while not list(output.glob("runs/slow_steps-*/workers/rank0.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        listed = runs(output, "--json")
        states = {os.path.basename(v["command"][0]) if "exact" not in v["command"][0] else v["command"][2]: v
                  for v in listed}
        assert states[str(tmp_path / "finished")]["state"].startswith("finished")
        assert states[str(tmp_path / "stopped")]["state"].startswith("stopped at epoch ")
        assert states["failing.py"]["state"].startswith(
            "failed with exit 1 on rank 0: KeyError: 'IDS_LOG' ("), states["failing.py"]  # the line that failed
        assert states["slow_steps.py"]["live"] and states["slow_steps.py"]["state"].startswith(
            f"running as pid {live.pid} on ")
        shown = run([DISTRAIN, "runs", "show", states[str(tmp_path / "finished")]["name"], "--dir", str(output)],
                    env=clean_env()).stdout
        assert re.search(r"^resume +nothing to resume: it finished; its command, run again, trains it again", shown,
                         re.M), shown
        # each write apart from the first, whose time carries Keras' save warm-up (stop-cost.json keeps them all),
        # and how long each held the training (Keras 3's: written off the training's path)
        assert re.search(r"^stop needs +an epoch's end up to [\d.]+ s .*checkpoint up to [\d.]+ s \(a write [\d.]+ s, "
                         r"the first [\d.]+ s with Keras' warm-up\), training held [\d.]+ s by each; "
                         r"the job's signal lead 1 s$", shown, re.M), shown
        text = runs(output)
        assert text.startswith(f"runs in {output}/runs: 4") and "resume: distrain run " in text, text
        refused = run([DISTRAIN, "runs", "rm", "-y", states["slow_steps.py"]["name"], "--dir", str(output)], env=env)
        assert refused.returncode == 2 and "running; stop it first" in refused.stdout, refused.stdout
    finally:
        live.kill()
    # the stopped run's own resume command, as `distrain runs` prints it, resumes it
    resume = states[str(tmp_path / "stopped")]["resume"]
    resumed = subprocess.run(["bash", "-c", resume], env=env, capture_output=True, text=True, timeout=300)
    resumed_at = re.search(r"resuming run exact_resume-\w+ at (.+?) \(", resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0 and resumed_at, resumed.stdout[-2000:]
    assert states[str(tmp_path / "stopped")]["state"] == f"stopped at {resumed_at.group(1)}"
    after = {v["name"]: v["state"] for v in runs(output, "--json")}
    assert after[states[str(tmp_path / "stopped")]["name"]].startswith("finished")
    assert after[states["slow_steps.py"]["name"]].startswith("ended without a word: killed?")
    removed = run([DISTRAIN, "runs", "rm", "-y", states["failing.py"]["name"], "--dir", str(output)], env=env)
    assert removed.returncode == 0 and not os.path.exists(states["failing.py"]["directory"])
