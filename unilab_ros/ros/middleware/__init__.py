"""Middleware settings the node executables apply before ROS 2 starts."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

FASTDDS_PROFILE = Path(__file__).with_name("fastdds_profile.xml")


def apply_fastdds_profile(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Point Fast DDS at the package's profile unless the user chose one; True if applied.

    RMW_FASTRTPS_USE_QOS_FROM_XML lets the profile's memory policy stand (rmw_fastrtps
    overrides it otherwise); QoS the nodes set in code still win over the profile.
    """
    if "FASTDDS_DEFAULT_PROFILES_FILE" in environ or "FASTRTPS_DEFAULT_PROFILES_FILE" in environ:
        return False
    environ["FASTDDS_DEFAULT_PROFILES_FILE"] = str(FASTDDS_PROFILE)
    environ.setdefault("RMW_FASTRTPS_USE_QOS_FROM_XML", "1")
    return True
