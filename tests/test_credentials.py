"""``tether._credentials``: child environments, masking, and the process's own listing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tether._credentials import (
    CREDENTIAL_VARIABLES,
    MASK,
    MIN_SECRET_LENGTH,
    Masker,
    child_environment,
    register_secret,
    registered_secrets,
)

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cr3t-Value-Zx81Lm"


# --------------------------------------------------------------------------- environment


def test_child_environment_drops_credential_variables() -> None:
    environ = {name: SECRET for name in CREDENTIAL_VARIABLES} | {"PATH": "/bin", "HOME": "/h"}
    assert child_environment(environ=environ, secrets=()) == {"PATH": "/bin", "HOME": "/h"}
    assert {"TETHER_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"} <= (
        CREDENTIAL_VARIABLES
    )


def test_child_environment_drops_values_holding_a_secret_and_named_sources() -> None:
    environ = {
        "MY_KEY": SECRET,
        "AUTH": f"Bearer {SECRET}",
        "SOURCE": "configured key source",
        "SHORT": "abc",
        "PATH": "/bin",
    }
    env = child_environment(environ=environ, secrets=(SECRET, "abc"), drop=("SOURCE",))
    # "abc" is shorter than the minimum: it is not a secret, SHORT stays.
    assert env == {"SHORT": "abc", "PATH": "/bin"}


def test_pass_env_keeps_named_variables_whatever_the_rules() -> None:
    environ = {"TETHER_API_KEY": SECRET, "MY_KEY": SECRET, "PATH": "/bin"}
    env = child_environment(("TETHER_API_KEY", "MY_KEY", "ABSENT"), environ=environ)
    assert env == environ


def test_child_environment_defaults_to_this_process_and_registered_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register_secret("registered-" + SECRET)
    monkeypatch.setenv("TETHER_API_KEY", "x" * 20)
    monkeypatch.setenv("COPY_OF_KEY", "registered-" + SECRET)
    monkeypatch.setenv("UNRELATED", "kept")
    env = child_environment()
    assert "TETHER_API_KEY" not in env and "COPY_OF_KEY" not in env
    assert env["UNRELATED"] == "kept"


def test_register_secret_ignores_short_values() -> None:
    just_long_enough = "Qz7" + "k" * (MIN_SECRET_LENGTH - 3)
    register_secret("short")
    register_secret(f"  {just_long_enough}  ")
    assert "short" not in registered_secrets()
    assert just_long_enough in registered_secrets()


# --------------------------------------------------------------------------- masking


def test_masker_replaces_exact_occurrences_only() -> None:
    masker = Masker((SECRET,))
    assert masker.text(f"key={SECRET}; again {SECRET}.") == f"key={MASK}; again {MASK}."
    assert masker.text(SECRET[:-1]) == SECRET[:-1]  # a partial key is not an occurrence
    assert masker.text("nothing here") == "nothing here"


def test_short_secrets_never_mask_ordinary_text() -> None:
    masker = Masker(("pass", "x" * (MIN_SECRET_LENGTH - 1)))
    assert not masker
    assert masker.text("pass the password") == "pass the password"
    assert masker.value({"a": ["pass"]}) == {"a": ["pass"]}


def test_longest_secret_is_masked_whole() -> None:
    inner = "inner-secret-1"
    masker = Masker((inner, f"outer-{inner}-x"))
    assert masker.text(f"[outer-{inner}-x] [{inner}]") == f"[{MASK}] [{MASK}]"


def test_json_escaped_forms_are_masked() -> None:
    secret = 'quo"te\\back-é-Secret'
    masker = Masker((secret,))
    arguments = json.dumps({"command": f"echo {secret}"})
    ascii_arguments = json.dumps({"command": f"echo {secret}"}, ensure_ascii=True)
    unicode_arguments = json.dumps({"command": f"echo {secret}"}, ensure_ascii=False)
    for text in (arguments, ascii_arguments, unicode_arguments):
        masked = masker.text(text)
        assert json.loads(masked) == {"command": f"echo {MASK}"}


def test_value_masks_nested_json_and_keys_and_copies_only_when_needed() -> None:
    masker = Masker((SECRET,))
    fact = {
        "kind": "entry",
        "seq": 3,
        "entry": {"message": {"content": f"it is {SECRET}", "tool_calls": [{"id": "c1"}]}},
        "flags": (True, None, 1.5),
        SECRET: "as a key",
    }
    masked = masker.value(fact)
    assert masked["entry"]["message"]["content"] == f"it is {MASK}"
    assert masked[MASK] == "as a key" and SECRET not in masked
    assert masked["flags"] == (True, None, 1.5) and masked["seq"] == 3
    assert masked["entry"]["message"]["tool_calls"] is fact["entry"]["message"]["tool_calls"]
    clean = {"a": [1, "b"]}
    assert masker.value(clean) is clean
    assert masker.contains(fact) and not masker.contains(clean)
    assert fact["entry"]["message"]["content"] == f"it is {SECRET}"  # input untouched


_SECRET_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",))
_JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(_SECRET_CHARS, min_size=8, max_size=24)
    | st.from_regex(r'[A-Za-z0-9"\\é_ -]{8,24}', fullmatch=True),
    value=_JSON_LIKE,
    where=st.sampled_from(["none", "plain", "json", "ascii", "key"]),
)
@example(secret="[redacted]", value=None, where="plain")  # the mask itself, found by hypothesis
def test_the_probe_never_skips_a_value_that_holds_a_secret(
    secret: str, value: object, where: str
) -> None:
    # value() first looks for each secret's longest letter-and-digit run in the value's
    # encoding and returns it untouched when none is there: it must answer exactly as the
    # full walk does, whatever the secret's characters and wherever it hides.
    masker = Masker((secret,))
    inner = {
        "none": "nothing here",
        "plain": f"say {secret}!",
        "json": json.dumps({"command": secret}),
        "ascii": json.dumps({"command": secret}, ensure_ascii=True),
        "key": "",
    }[where]
    data = {"value": value, "text": inner, **({secret: 1} if where == "key" else {})}
    assert masker.value(data) == masker._walk(data)
    if where != "none":
        assert masker.contains(data)


def test_a_value_without_a_secret_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    masker = Masker(("sk-live-" + SECRET,))
    assert masker._probes == (b"s3cr3t",)  # the longest run of letters and digits
    walked: list[object] = []
    walk = Masker._walk
    monkeypatch.setattr(Masker, "_walk", lambda self, v: walked.append(v) or walk(self, v))
    clean = {"kind": "entry", "entry": {"content": ["a" * 50, {"b": 1}]}}
    assert masker.value(clean) is clean and walked == []
    assert masker.value({"x": (1, 2**70)}) == {"x": (1, 2**70)} and walked  # orjson cannot
    dirty = {"content": f"key sk-live-{SECRET}"}
    assert masker.value(dirty) == {"content": f"key {MASK}"}
    assert Masker(("a$b%c&d*e(fgh)",))._probes is None  # no long run: always walked


def test_for_process_uses_the_registered_secrets() -> None:
    register_secret("process-wide-" + SECRET)
    assert Masker.for_process().text("process-wide-" + SECRET) == MASK
    assert Masker.for_process(("extra-" + SECRET,)).text("extra-" + SECRET) == MASK


# --------------------------------------------------------------------------- /proc listing


def test_hide_from_process_listing_rewrites_cmdline_and_environ() -> None:
    code = (
        "import os, sys\n"
        "from tether._credentials import hide_from_process_listing\n"
        "secret = sys.argv[2]\n"
        "print(hide_from_process_listing([secret]))\n"
        "print(secret.encode() in open('/proc/self/cmdline', 'rb').read())\n"
        "print(secret.encode() in open('/proc/self/environ', 'rb').read())\n"
        "print(sys.argv[2] == secret and os.environ['HIDDEN'] == secret)\n"
    )
    env = dict(os.environ, HIDDEN=SECRET, PYTHONPATH=str(ROOT / "src"))
    result = subprocess.run(
        [sys.executable, "-c", code, "--api-key", SECRET],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=True,
    )
    # Rewritten; gone from both listings; Python's own copies keep the real value.
    assert result.stdout.split() == ["True", "False", "False", "True"], result.stderr


def test_hiding_the_same_secrets_again_is_free_and_a_new_secret_is_still_hidden() -> None:
    """A worker hides once per agent it builds: the second call with the same secrets
    rewrites nothing; a secret registered later is still hidden."""
    later = "another-credential-" + SECRET[::-1]
    code = (
        "import sys\n"
        "from tether._credentials import hide_from_process_listing as hide\n"
        "first, later = sys.argv[2], sys.argv[4]\n"
        "print(hide([first]), hide([first]), hide([first, later]))\n"
        "listing = open('/proc/self/cmdline', 'rb').read()\n"
        "print(first.encode() in listing, later.encode() in listing)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    result = subprocess.run(
        [sys.executable, "-c", code, "--api-key", SECRET, "--other", later],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=True,
    )
    assert result.stdout.split() == ["True", "False", "True", "False", "False"], result.stderr


def test_the_model_adapter_registers_its_key_but_not_the_local_placeholder() -> None:
    from tether._models.openai_compat import OpenAICompatibleModel

    key = "adapter-key-" + SECRET
    OpenAICompatibleModel("m", base_url="https://api.example.com/v1", api_key=key)
    assert key in registered_secrets()
    before = registered_secrets()
    OpenAICompatibleModel("m", base_url="http://127.0.0.1:9/v1")  # placeholder key
    assert registered_secrets() == before
