"""Resolve the pinned install against the public Python package index alone, for every promised
platform.

`make lab` and `make test` install `.[notebooks,test]` with `-c constraints.txt`. A green CI on
a machine whose pip has local wheels proves nothing about a student's laptop, so this script
asks pip to resolve exactly that install for other machines (`--dry-run --platform
--python-version --only-binary=:all:`), with every pip configuration file, `PIP_*` variable and
local wheel folder switched off, against https://pypi.org/simple only. It fails with the
resolver's own message, and also when a resolved package is not pinned in constraints.txt. Two
details make the dry run honest and quick: environment markers are evaluated for the target
machine (pip alone evaluates them for the machine it runs on), and `--use-feature=fast-deps`
reads each wheel's metadata with HTTP range requests instead of downloading gigabytes of CUDA
wheels.

`environment.yml` is checked the same way: its Python version and its pip arguments are read
from the file, so the conda route can never drift from the pins.

Usage: python tools/check_install.py [--only NAME ...] [--sizes] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PUBLIC_INDEX = "https://pypi.org/simple"
EXTRAS = ".[notebooks,test]"


def manylinux_tags(arch: str, newest_glibc_minor: int = 28) -> list[str]:
    """Every manylinux tag a glibc 2.`newest` machine accepts (pip does not expand
    `--platform`)."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest_glibc_minor, 16, -1)]
    return tags + [f"manylinux2014_{arch}"]


def macos_arm64_tags(newest_major: int = 14) -> list[str]:
    """Every macOS tag an Apple-silicon machine on macOS `newest_major` accepts."""
    tags = []
    for major in range(newest_major, 10, -1):
        tags += [f"macosx_{major}_0_arm64", f"macosx_{major}_0_universal2"]
    return tags + [f"macosx_10_{minor}_universal2" for minor in range(16, 8, -1)]


@dataclass(frozen=True)
class Platform:
    """Wheel tags a machine accepts, and the values its environment markers take there.

    pip applies `--platform` to wheel tags only; markers such as torch's
    `platform_system == "Linux"` it still evaluates for the machine it runs on. So the resolver
    is run with the target's marker values patched in (see `run_pip_as`).
    """

    wheel_tags: tuple[str, ...]
    os_name: str
    sys_platform: str
    platform_system: str
    platform_machine: str
    platform_release: str


# glibc 2.28 is the oldest that torch's Linux wheels support; macOS 14 the oldest for its Mac
# wheels.
PLATFORMS = {
    "linux-x86_64": Platform(
        tuple(manylinux_tags("x86_64")), "posix", "linux", "Linux", "x86_64", "6.8.0"
    ),
    "linux-aarch64": Platform(
        tuple(manylinux_tags("aarch64")), "posix", "linux", "Linux", "aarch64", "6.8.0"
    ),
    "macos-arm64": Platform(
        tuple(macos_arm64_tags()), "posix", "darwin", "Darwin", "arm64", "23.0.0"
    ),
    # Not a promised platform for `make` (use WSL2, which is linux-x86_64); checked so the
    # README can say truthfully what a plain `pip install` gives there.
    "windows-amd64": Platform(("win_amd64",), "nt", "win32", "Windows", "AMD64", "10"),
}
# The oldest and the newest Python the README promises. 3.11.5 because soupsieve (via
# nbconvert) and numpy 2.4 need it.
PYTHONS = ["3.11.5", "3.13.0"]


@dataclass(frozen=True)
class Target:
    """One machine to resolve for: a platform, a Python version and the pip arguments to
    check."""

    name: str
    platform: Platform
    python_version: str
    requirements: tuple[str, ...]

    def pip_args(self, report: Path) -> list[str]:
        major, minor = self.python_version.split(".")[:2]
        args = [
            "install",
            "--dry-run",
            "--ignore-installed",
            "--only-binary=:all:",
            "--index-url",
            PUBLIC_INDEX,
            "--use-feature=fast-deps",
            "--no-input",
            "--python-version",
            self.python_version,
            "--implementation",
            "cp",
            "--abi",
            f"cp{major}{minor}",
            "--abi",
            "abi3",
            "--abi",
            "none",
            "--report",
            str(report),
        ]
        for tag in self.platform.wheel_tags:
            args += ["--platform", tag]
        return args + list(self.requirements)

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker values of the target machine (what `packaging` would compute
        there)."""
        return {
            "implementation_name": "cpython",
            "implementation_version": self.python_version,
            "os_name": self.platform.os_name,
            "platform_machine": self.platform.platform_machine,
            "platform_release": self.platform.platform_release,
            "platform_system": self.platform.platform_system,
            "platform_version": "",
            "python_full_version": self.python_version,
            "platform_python_implementation": "CPython",
            "python_version": ".".join(self.python_version.split(".")[:2]),
            "sys_platform": self.platform.sys_platform,
        }


def environment_yml_target() -> Target:
    """The conda route: environment.yml's Python and pip lines, resolved on Linux x86_64."""
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    python = next(
        str(dep).split("=", 1)[1]
        for dep in env["dependencies"]
        if str(dep).startswith("python=")
    )
    pip_lines = next(
        dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict) and "pip" in dep
    )
    requirements: list[str] = []
    for line in pip_lines:
        requirements += line.split(" ", 1)
    # conda-forge installs the newest patch release; the oldest we accept is our floor.
    floor = next((v for v in PYTHONS if v.startswith(python + ".")), None)
    if floor is None:
        raise SystemExit(
            f"environment.yml asks for python={python}, which is not among the checked "
            f"{PYTHONS}"
        )
    return Target(
        "environment.yml on linux-x86_64",
        PLATFORMS["linux-x86_64"],
        floor,
        tuple(requirements),
    )


def all_targets() -> list[Target]:
    targets = [
        Target(f"{name} python {python}", platform, python, ("-c", "constraints.txt", EXTRAS))
        for name, platform in PLATFORMS.items()
        for python in PYTHONS
    ]
    return targets + [environment_yml_target()]


def run_pip_as(marker_environment: dict[str, str], pip_args: list[str]) -> int:
    """Run pip in this process with environment markers evaluated for another machine.

    pip's vendored `packaging` looks the marker environment up through
    `markers.default_environment()` on every evaluation; replacing that function is the one
    change needed (pip is pinned in constraints.txt, so this hook cannot move under us).
    """
    from pip._internal.cli.main import main as pip_main
    from pip._vendor.packaging import markers

    markers.default_environment = lambda: dict(marker_environment)
    probe = markers.Marker(f'sys_platform == "{marker_environment["sys_platform"]}"')
    if not probe.evaluate():
        raise SystemExit(
            "could not override pip's marker environment (has pip's vendored packaging "
            "changed?)"
        )
    return pip_main(pip_args)


def canonical(name: str) -> str:
    """A project name as the index compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_names(constraints: Path = REPO / "constraints.txt") -> set[str]:
    """Projects that constraints.txt pins with `==`."""
    names = set()
    for line in constraints.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            names.add(canonical(line.split("==", 1)[0].strip()))
    return names


def public_only_env() -> dict[str, str]:
    """This process's environment with every pip setting removed: no config files, no local
    wheels."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def resolver_message(output: str) -> str:
    """pip's own explanation of the failure: everything from its first ERROR line on."""
    lines = output.rstrip().splitlines()
    first_error = next(
        (i for i, line in enumerate(lines) if line.startswith("ERROR")),
        max(len(lines) - 30, 0),
    )
    return "\n".join(lines[first_error:])


@dataclass
class Result:
    target: Target
    ok: bool
    seconds: float
    packages: dict[str, str]
    urls: list[str]
    message: str


def resolve(target: Target) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        started = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--pip-as",
                json.dumps(target.marker_environment()),
                "--",
                *target.pip_args(report),
            ],
            cwd=REPO,
            env=public_only_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seconds = time.monotonic() - started
        if proc.returncode != 0 or not report.exists():
            return Result(target, False, seconds, {}, [], resolver_message(proc.stdout))
        items = json.loads(report.read_text())["install"]
    packages = {item["metadata"]["name"]: item["metadata"]["version"] for item in items}
    urls = [
        item["download_info"]["url"]
        for item in items
        if item["download_info"]["url"].startswith("http")
    ]
    return Result(target, True, seconds, packages, urls, "")


def download_megabytes(urls: list[str]) -> float:
    """Sum of the wheel sizes, read from the index's JSON pages (pip's report has no sizes)."""
    import urllib.request

    sizes: dict[str, int] = {}
    projects = {
        url.rsplit("/", 1)[1].split("-", 1)[0].lower().replace("_", "-") for url in urls
    }
    for project in projects:
        request = urllib.request.Request(
            f"{PUBLIC_INDEX}/{project}/",
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            for file in json.load(response)["files"]:
                sizes[file["url"].split("#")[0]] = file.get("size", 0)
    return sum(sizes.get(url.split("#")[0], 0) for url in urls) / 1e6


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--pip-as"]:  # internal: the resolver subprocess started by `resolve`
        return run_pip_as(json.loads(argv[1]), argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="check only the targets whose name contains one of these strings",
    )
    parser.add_argument(
        "--sizes", action="store_true", help="also print how much each target downloads"
    )
    # A resolve mostly waits on the index (one target: about 11 s of CPU in 84 s), so by
    # default every target resolves at once: the run takes about as long as its slowest target.
    parser.add_argument(
        "--jobs", type=int, default=None, help="targets resolved at once (default: all)"
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")

    targets = [
        t for t in all_targets() if args.only is None or any(s in t.name for s in args.only)
    ]
    if not targets:
        parser.error("--only matched no target")
    print(
        f"Resolving {EXTRAS} -c constraints.txt against {PUBLIC_INDEX} alone "
        f"(pip configuration and local wheels off), {len(targets)} targets",
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=args.jobs or len(targets)) as pool:
        results = list(pool.map(resolve, targets))

    failed = 0
    pinned = pinned_names()
    for result in results:
        unpinned = sorted(
            f"{n}=={v}"
            for n, v in result.packages.items()
            if canonical(n) not in pinned | {"refimpl"}
        )
        if result.ok and unpinned:
            result.ok = False
            result.message = (
                "resolves, but these are not pinned in constraints.txt, so a new release "
                "could "
                "change the install: " + " ".join(unpinned)
            )
        if result.ok:
            pins = ", ".join(
                f"{name}=={result.packages[name]}"
                for name in ("torch", "triton", "numpy")
                if name in result.packages
            )
            line = (
                f"ok    {result.target.name}: {len(result.packages)} packages ({pins}) "
                f"in {result.seconds:.0f} s"
            )
            if args.sizes:
                line += f", {download_megabytes(result.urls):,.0f} MB to download"
            print(line, flush=True)
        else:
            failed += 1
            print(f"FAIL  {result.target.name}:\n{result.message}\n", flush=True)
    if failed:
        print(f"{failed} of {len(results)} targets do not resolve against the public index.")
        return 1
    print(f"All {len(results)} targets resolve against the public index.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
