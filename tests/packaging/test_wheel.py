"""An installed wheel finds schemas/ and problems/ the way a checkout does, and writes events under the cwd."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True)
    wheel = next(out.glob("mkb-*.whl"))
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)  # a wheel is a zip laid out as site-packages
    return wheel, target


def test_the_wheel_carries_the_schemas_and_the_problems(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "mkb/_data/schemas/verdict.json" in names
    assert any(n.startswith("mkb/_data/problems/mlp_norm/28_") and n.endswith("/problem.py") for n in names)


def test_an_installed_mkb_reads_its_data_and_writes_events_under_the_working_directory(installed, tmp_path):
    _, target = installed
    work = tmp_path / "work"
    work.mkdir()
    code = (
        "import mkb, mkb._resources as r\n"
        "from mkb.events import EventWriter, schemas\n"
        "assert str(r.data_dir('schemas')).startswith(sys.argv[1]), r.data_dir('schemas')\n"
        "assert str(r.data_dir('problems')).startswith(sys.argv[1]), r.data_dir('problems')\n"
        "assert 'verdict' in schemas()\n"
        "w = EventWriter(); w.emit('annotation', target_attempt_id='a', label='clean', reason='r', annotator='t')\n"
        "print(w.flush()[0])\n"
    )
    res = subprocess.run([sys.executable, "-c", "import sys\n" + code, str(target)], cwd=work, capture_output=True,
                         text=True, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    written = Path(res.stdout.strip())
    assert written.is_relative_to(work / "events" / "local"), written
