from setuptools import setup

# PyPy: cryptography 43.0.3 is the newest release with a PyPy 3.9 binary
# wheel; a source build needs a Rust toolchain and crates that pip does not
# fetch, so under PyPy the TLS extras hold it below 44, and pyOpenSSL below
# 25.2 (the first to need cryptography 45), which leaves pip nothing to
# backtrack through (Twisted's tls extra follows: 25.5).  CPython keeps the
# newest of each.
PYPY_TLS = [
    "cryptography<44; platform_python_implementation == 'PyPy'",
    "pyOpenSSL<25.2; platform_python_implementation == 'PyPy'",
]

setup(
    name="jesync",
    version="0.1.0",
    description="A lock server (mutexes and counting semaphores) speaking the JESync protocol, on Twisted",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.9",
    # twisted/plugins has no __init__.py: it is Twisted's namespace for dropins.
    packages=["jesync", "jesync.client", "jesync.connections", "jesync.protocols", "twisted.plugins"],
    package_data={"twisted.plugins": ["jesync_plugin.py"]},
    entry_points={"console_scripts": ["jesync = jesync.cli:main"]},
    install_requires=["twisted>=23.10", "zope.interface>=5", "automat>=22.10"],
    extras_require={
        # --metrics: Prometheus text format, served by twisted.web
        "metrics": ["prometheus_client>=0.17"],
        # ssl: endpoints (TLS listeners)
        "tls": ["twisted[tls]", *PYPY_TLS],
        # The suite covers metrics and TLS too, so it needs both extras.
        "test": ["pytest>=7", "pytest-twisted>=1.14", "hypothesis>=6", "prometheus_client>=0.17", "twisted[tls]", *PYPY_TLS],
        # mypy over jesync/ (setup.cfg), which checks jesync.metrics against
        # prometheus_client's types too.  Each mypy-zope release pins the mypy
        # versions it supports (1.0.5 is the first to take mypy 1.10).
        "typecheck": ["mypy>=1.10", "mypy-zope>=1.0.5", "prometheus_client>=0.17"],
    },
    classifiers=[
        "Framework :: Twisted",
        "Programming Language :: Python :: 3",
        "Topic :: System :: Distributed Computing",
    ],
)
