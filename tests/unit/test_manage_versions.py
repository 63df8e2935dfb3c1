"""`vllm-vspec manage`: how versions of ours compare, a build without CANN
(local label ending `.nocann`) included (no install)."""

from __future__ import annotations

from vllm_vspec.commands.manage import Installed, _version_key, validate

CANN = "0.23.0.post1+vspec0.1.0"
NOCANN = "0.23.0.post1+vspec0.1.0.nocann"


def test_a_cann_build_is_newer_than_the_cann_less_build_of_the_same_version():
    assert _version_key(CANN) > _version_key(NOCANN)


def test_a_newer_version_without_cann_is_still_newer():
    assert _version_key("0.23.0.post1+vspec0.2.0.nocann") > _version_key(CANN)


def test_a_cann_less_overlay_validates_against_the_manifest_of_its_version():
    env = Installed(python="python", prefix="/p", identity="overlay", version=NOCANN,
                    host_version=NOCANN, entry_points={}, state_path=None,
                    enabled_by_default=True, manifest={"extension_version": "0.1.0",
                                                       "entry_points": {}})
    assert not [p for p in validate(env) if "extension_version" in p]
