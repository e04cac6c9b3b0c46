"""The tree is the project's own work: no file but LICENSE carries a copyright notice. Protocol facts
taken from other projects (the .proto files written from the served descriptors, KServe's CRD schemas in
tests/data/kserve/) carry none, and name their source beside them."""

import gzip
import re
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
# A notice as licenses ask for one; written so that this file's own lines do not match it
NOTICE = re.compile(r"copyright\s+(\(c\)|©|\d{4})|©\s*\d{4}|all\s+rights\s+reserved|SPDX-License-Identifier\s*:", re.I)


def tracked_texts():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT, capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split("\0")):
        data = (PROJECT / name).read_bytes()
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        if b"\0" not in data[:8192]:  # text
            yield name, data.decode(errors="replace")


def test_no_file_but_the_license_carries_a_copyright_notice():
    found = [f"{name}:{number}: {line.strip()[:80]}" for name, text in tracked_texts() if name != "LICENSE"
             for number, line in enumerate(text.splitlines(), 1) if NOTICE.search(line)]
    assert found == []


def test_the_license_is_apache_2_and_the_package_says_so():
    import tomllib

    license_text = (PROJECT / "LICENSE").read_text()
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    assert license_text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in license_text
    assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])
    assert "Apache-2.0" in (PROJECT / "README.md").read_text()
