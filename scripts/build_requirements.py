#!/usr/bin/env python3
"""Prints the Python package's build requirements, one per line, as pyproject.toml pins them (one
place for their ranges): for scripts/python_wheels.sh and tests/python/run_package_tests.sh.
With --missing, only those the running interpreter's environment does not already satisfy, so
that a machine without network (a GPU machine whose Python has them) installs nothing from PyPI."""

import importlib.metadata
import re
import sys


def satisfied(requirement: str) -> bool:
    """Whether an installed distribution meets `requirement` (name and version specifiers)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip vendors packaging; every environment that can install has pip
        from pip._vendor.packaging.requirements import Requirement
    parsed = Requirement(requirement)
    try:
        version = importlib.metadata.version(parsed.name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return parsed.specifier.contains(version, prereleases=True)


def main(path: str, missing_only: bool) -> None:
    text = open(path).read()
    try:
        import tomllib

        requires = tomllib.loads(text)["build-system"]["requires"]
    except ImportError:  # Python < 3.11: the one line of pyproject.toml that holds them
        requires = re.findall(r"\"([^\"]+)\"", re.search(r"^requires = \[(.*)\]", text, re.M)[1])
    if missing_only:
        requires = [r for r in requires if not satisfied(r)]
    if requires:
        print("\n".join(requires))


if __name__ == "__main__":
    args = sys.argv[1:]
    missing = "--missing" in args
    paths = [a for a in args if a != "--missing"]
    if len(paths) != 1:
        sys.exit("usage: build_requirements.py [--missing] PYPROJECT_TOML")
    main(paths[0], missing)
