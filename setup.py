# Every piece of the package's metadata and build configuration is in
# pyproject.toml (PEP 621, and [tool.setuptools] for the packages, the
# twisted/plugins dropin and the package data).  This file stays so that the
# layout keeps a setup.py; it adds nothing.
from setuptools import setup

setup()
