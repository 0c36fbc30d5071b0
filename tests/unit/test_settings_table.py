"""One settings table (entrypoint/settings.py's SETTINGS): every DISTRAIN_* variable the package, the job files
and the scripts read is in it; the reference's Configuration tables name exactly its public ones, each with the
table's default, and list its internal ones as such; the Plan's numbers unset are the table's defaults."""

import re

from entrypoint import settings
from entrypoint.plan import detect, launch_settings
from helpers import ROOT

REFERENCE = (ROOT / "docs" / "reference.md").read_text()
CONFIGURATION = REFERENCE[REFERENCE.index("## Configuration"):REFERENCE.index("## Troubleshooting")]
SOURCES = [p for folder in ("entrypoint", "jobs", "bin", "scripts", "image") for p in (ROOT / folder).rglob("*")
           if p.is_file() and p.suffix in (".py", ".sh", ".job", "")] + [ROOT / "Apptainer.def", ROOT / "Dockerfile"]
NAME = re.compile(r"\bDISTRAIN_[A-Z_]*[A-Z]\b")


def rows(text: str) -> list[tuple[list[str], str]]:
    """(the variables a table row names, its default cell without backticks)."""
    found = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            found.append((NAME.findall(cells[0]), cells[1].replace("`", "")))
    return found


def test_every_variable_read_anywhere_is_in_the_table():
    read = {name for path in SOURCES for name in NAME.findall(path.read_text(errors="replace"))}
    assert read - set(settings.BY_NAME) == set(), read - set(settings.BY_NAME)
    assert set(settings.BY_NAME) - read == set(), set(settings.BY_NAME) - read  # nothing listed that nothing reads


def test_the_reference_documents_the_public_ones_with_their_defaults_and_lists_the_internal_ones():
    public = {s.name for s in settings.SETTINGS if not s.internal}
    internal = {s.name for s in settings.SETTINGS if s.internal}
    settings_part, internal_part = CONFIGURATION.split("### Internal variables")
    documented = {name for names, _ in rows(settings_part) for name in names}
    assert documented == public, (documented ^ public)
    for names, default in rows(settings_part):
        if len(names) == 1:  # a row of its own: its default as the table writes it
            assert default == settings.BY_NAME[names[0]].documented, (names[0], default)
    assert {name for names, _ in rows(internal_part) for name in names} == internal


def test_the_plans_numbers_unset_are_the_tables_defaults():
    plan = detect({}, gpus=[])
    read = {"DISTRAIN_CHECKPOINT_MINUTES": plan.checkpoint_minutes, "DISTRAIN_STOP_CHECK_SECONDS":
            plan.stop_check_seconds, "DISTRAIN_STALL_SECONDS": plan.stall_seconds, "DISTRAIN_STALL_PAUSE_SECONDS":
            plan.stall_pause_seconds, "DISTRAIN_START_TIMEOUT": plan.start_timeout, "DISTRAIN_MAX_RESTARTS":
            plan.max_restarts, "DISTRAIN_KILL_WAIT": launch_settings({}).kill_wait}
    for name, value in read.items():
        assert value == settings.BY_NAME[name].default, name
    assert plan.stop_lead_seconds is None  # unset: the job file's lead
