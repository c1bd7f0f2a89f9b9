"""Package list for setuptools: ``plugins/`` installs under the import name ``meshctl_plugins``.

pyproject.toml cannot rename found packages, so the list is computed here; everything else about
the distribution lives in pyproject.toml.
"""

from setuptools import find_packages, setup

PLUGINS_DIR = "plugins"
PLUGINS_PACKAGE = "meshctl_plugins"

setup(
    packages=find_packages(include=["meshctl", "meshctl.*"])
    + [
        PLUGINS_PACKAGE + name[len(PLUGINS_DIR) :]
        for name in find_packages(include=[PLUGINS_DIR, PLUGINS_DIR + ".*"])
    ],
)
