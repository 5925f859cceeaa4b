"""The Fast DDS profile the node executables apply before ROS 2 starts."""

from pathlib import Path

from unilab_ros.ros.middleware import apply_fastdds_profile


def test_the_fastdds_profile_applies_unless_the_user_chose_one():
    environ: dict[str, str] = {}
    assert apply_fastdds_profile(environ)
    assert Path(environ["FASTDDS_DEFAULT_PROFILES_FILE"]).is_file()
    assert environ["RMW_FASTRTPS_USE_QOS_FROM_XML"] == "1"
    mine = {"FASTDDS_DEFAULT_PROFILES_FILE": "/etc/my_profile.xml"}
    assert not apply_fastdds_profile(mine)
    assert mine == {"FASTDDS_DEFAULT_PROFILES_FILE": "/etc/my_profile.xml"}
