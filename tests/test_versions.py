"""The versions and the time every output and table records (helpers.engine.contract.versions)."""
import platform
import re

from helpers.engine.contract.versions import created, package_versions


def test_versions_name_what_is_installed_and_say_what_is_missing():
    found = package_versions(("numpy", "no-such-package-gpufeed"))
    assert found["python"] == platform.python_version()
    assert re.fullmatch(r"\d+\.\d+.*", found["numpy"])
    assert found["no-such-package-gpufeed"] == "missing"


def test_created_is_iso_8601_with_the_local_offset():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", created())
