"""A script's own packages (README, Quick start): DISTRAIN_REQUIREMENTS names a requirements file; its virtualenv
is built once, by one of the ranks while the other waits, over the image's packages; `distrain packages` builds it
beforehand; a requirement that would replace the image's NumPy is refused before anything installs."""

from helpers import DISTRAIN, a_wheel, clean_env, run

SCRIPT = "import labtools, numpy\nprint('labtools', labtools.ANSWER, 'numpy', numpy.__version__, flush=True)\n"


def test_requirements_are_installed_once_over_the_images_packages_and_never_replace_them(tmp_path):
    import numpy

    wheels = a_wheel(tmp_path / "wheels")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"--no-index\n--find-links {wheels}\nlabtools==1.0\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path / "out"), DISTRAIN_REQUIREMENTS=str(requirements))
    both = run([DISTRAIN, "launch", "-n", "2", str(script)], env=env)
    assert both.returncode == 0, both.stdout[-3000:]
    assert both.stdout.count(f"labtools 42 numpy {numpy.__version__}") == 2, both.stdout[-3000:]  # the image's NumPy
    assert both.stdout.count("installing ") == 1, both.stdout[-3000:]  # one rank built, the other waited
    built = list((tmp_path / "out" / "packages").glob("*/.complete"))
    assert len(built) == 1 and oct(built[0].parent.parent.stat().st_mode & 0o777) == "0o700", built
    again = run([DISTRAIN, "packages", str(requirements)], env=env)  # the login node's: already built
    assert again.returncode == 0 and "installing" not in again.stdout, again.stdout
    assert f"packages ready: {built[0].parent}/lib/" in again.stdout, again.stdout
    plan = run([DISTRAIN, "plan"], env=env)
    assert f"packages    {requirements}" in plan.stdout or str(requirements) in plan.stdout, plan.stdout
    replacing = tmp_path / "old-numpy.txt"
    replacing.write_text(f"--no-index\n--find-links {wheels}\nlabtools==1.0\nnumpy==1.21.0\n")
    refused = run([DISTRAIN, "run", str(script)], env={**env, "DISTRAIN_REQUIREMENTS": str(replacing)})
    errors = [line for line in refused.stdout.splitlines() if "distrain: error:" in line]
    assert refused.returncode == 2 and len(errors) == 1 and "Traceback" not in refused.stdout, refused.stdout[-3000:]
    assert f"'numpy==1.21.0' would replace the image's numpy {numpy.__version__}" in errors[0], errors
    assert len(list((tmp_path / "out" / "packages").glob("*/.complete"))) == 1  # nothing installed for it
