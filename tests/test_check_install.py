"""tools/check_install.py: the pieces that decide what `make check-install` resolves (no
network here; CI runs the real resolution against the public index)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "check_install.py"


def load_script():
    spec = importlib.util.spec_from_file_location("check_install", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


check_install = load_script()


def test_every_promised_platform_and_python_is_a_target():
    names = [t.name for t in check_install.all_targets()]
    for platform in ("linux-x86_64", "linux-aarch64", "macos-arm64", "windows-amd64"):
        for python in ("3.11.5", "3.13.0"):
            assert f"{platform} python {python}" in names
    assert "environment.yml on linux-x86_64" in names


def test_environment_yml_is_checked_with_its_own_pip_lines():
    target = check_install.environment_yml_target()
    assert target.requirements == ("-c", "constraints.txt", "-e", ".[notebooks,test]")
    assert target.python_version == "3.11.5"


def test_wheel_tags_cover_older_manylinux_and_macos_releases():
    linux = check_install.PLATFORMS["linux-x86_64"].wheel_tags
    assert (
        linux[0] == "manylinux_2_28_x86_64"
        and "manylinux_2_17_x86_64" in linux
        and "manylinux2014_x86_64" in linux
    )
    mac = check_install.PLATFORMS["macos-arm64"].wheel_tags
    assert (
        "macosx_14_0_arm64" in mac
        and "macosx_11_0_arm64" in mac
        and "macosx_10_9_universal2" in mac
    )


def test_the_resolver_sees_no_local_configuration(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_INDEX_URL", "file:///somewhere")
    env = check_install.public_only_env()
    assert not any(
        key.startswith("PIP_")
        and key not in ("PIP_CONFIG_FILE", "PIP_DISABLE_PIP_VERSION_CHECK")
        for key in env
    )
    assert env["PIP_CONFIG_FILE"] == "/dev/null" or env["PIP_CONFIG_FILE"] == "nul"
    args = check_install.all_targets()[0].pip_args(Path("r.json"))
    assert args[args.index("--index-url") + 1] == "https://pypi.org/simple"
    assert "--only-binary=:all:" in args and "--dry-run" in args


def test_constraints_pin_torch_and_the_triton_it_requires():
    pins = {
        line.split(";")[0].strip()
        for line in (SCRIPT.parents[1] / "constraints.txt").read_text().splitlines()
    }
    # torch 2.13.0's own requirement on Linux
    assert "torch==2.13.0" in pins and "triton==3.7.1" in pins
    assert {"triton", "torch", "cuda-toolkit", "pip"} <= check_install.pinned_names()


@pytest.mark.parametrize("sys_platform, resolves", [("linux", True), ("darwin", False)])
def test_markers_are_evaluated_for_the_target_machine(tmp_path, sys_platform, resolves):
    """pip alone evaluates markers for the machine it runs on; the hook makes them the
    target's."""
    target = check_install.Target("t", check_install.PLATFORMS["linux-x86_64"], "3.11.5", ())
    marker_env = {**target.marker_environment(), "sys_platform": sys_platform}
    requirement = 'refimpl-no-such-project; sys_platform == "darwin"'
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--pip-as",
            json.dumps(marker_env),
            "--",
            "install",
            "--dry-run",
            "--no-index",
            "--ignore-installed",
            requirement,
        ],
        env=check_install.public_only_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # on "darwin" the marker holds, so pip must look for the (missing) project and fail
    assert (result.returncode == 0) == resolves, result.stdout + result.stderr


def test_a_failure_shows_the_resolvers_own_explanation():
    output = (
        "Collecting x\n  Downloading x.whl\nERROR: Cannot install refimpl\n\nThe conflict is "
        "caused by:\n"
        "    torch 2.13.0 depends on triton==3.7.1\n    The user requested (constraint) "
        "triton==3.9.0\n"
    )
    message = check_install.resolver_message(output)
    assert message.startswith("ERROR: Cannot install refimpl") and "triton==3.9.0" in message
    assert "Downloading" not in message
