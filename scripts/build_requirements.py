#!/usr/bin/env python3
"""Prints the Python package's build requirements, one per line, as pyproject.toml pins them (one
place for their ranges): for scripts/python_wheels.sh and tests/python/run_package_tests.sh."""

import re
import sys


def main(path: str) -> None:
    text = open(path).read()
    try:
        import tomllib

        requires = tomllib.loads(text)["build-system"]["requires"]
    except ImportError:  # Python < 3.11: the one line of pyproject.toml that holds them
        requires = re.findall(r"\"([^\"]+)\"", re.search(r"^requires = \[(.*)\]", text, re.M)[1])
    print("\n".join(requires))


if __name__ == "__main__":
    main(sys.argv[1])
