"""No credential reaches a grading process or the events it leaves (mkb._secrets): kernels are written by the models
under test, and what a worker prints is written into datasets that users publish."""

from __future__ import annotations

import glob
import json

import pyarrow.parquet as pq

from mkb._secrets import redact, secret_values, without_secrets
from mkb.grader import grade

SECRET = "sk-live-0123456789abcdef-do-not-publish"


def test_credential_names_values_and_redaction_inside_nested_values() -> None:
    env = {"OPENAI_API_KEY": SECRET, "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock", "GH_TOKEN": "short", "PATH": "/usr/bin",
           "CUDA_VISIBLE_DEVICES": "0", "UV_KEYRING_PROVIDER": "subprocess", "DB_PASSWORD": "/run/secrets/db",
           "HF_TOKEN": "hf_AbCdEf0123456789", "XDG_SESSION_ID": "c2-long-session-id"}
    # too short, a plain word, a path, or a name known to hold no secret: not redacted (it would rewrite ordinary text)
    assert secret_values(env) == {SECRET: "OPENAI_API_KEY", "hf_AbCdEf0123456789": "HF_TOKEN"}
    assert without_secrets(env) == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0"}  # but every such variable is withheld
    secrets = {SECRET: "OPENAI_API_KEY", SECRET[:20]: "PREFIX_TOKEN"}  # the longer value first, whatever the order given
    value = {"log": f"boom {SECRET}", SECRET: [f"a{SECRET}", (SECRET, 3)], "n": 1.5, "none": None}
    out = redact(value, secrets)
    assert out == {"log": "boom [redacted:OPENAI_API_KEY]", "[redacted:OPENAI_API_KEY]":
                   ["a[redacted:OPENAI_API_KEY]", ("[redacted:OPENAI_API_KEY]", 3)], "n": 1.5, "none": None}
    assert redact("nothing to hide", {}) == "nothing to hide"
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    assert redact(Pair(SECRET, 1), secrets) == Pair("[redacted:OPENAI_API_KEY]", 1)


def test_a_kernel_neither_inherits_a_credential_nor_gets_one_it_learned_into_the_events(tmp_path, fake_dsl, cpu_config,
                                                                                          store, monkeypatch) -> None:
    monkeypatch.setenv("MKB_TEST_API_KEY", SECRET)
    kernel = tmp_path / "kernel.py"
    kernel.write_text("import os\n\n\ndef solve(x, residual, weight):\n"
                      "    raise ValueError('env=' + os.environ.get('MKB_TEST_API_KEY', 'absent') + ' learned=' + "
                      f"{SECRET!r})\n")
    v = grade(28, fake_dsl, kernel, store=store, config=cpu_config)
    assert v.reason == "runtime_error", v.message
    assert "env=absent" in v.message  # the worker started without it
    written = ""
    for f in sorted(glob.glob(f"{store}/kind=*/*.parquet")):
        written += json.dumps(pq.read_table(f).to_pylist(), default=str)
    assert "learned=[redacted:MKB_TEST_API_KEY]" in written  # a value it got elsewhere (a file, /proc) is redacted
    assert SECRET not in written
