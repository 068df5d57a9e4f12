"""Packaging for mlcache.

The design card fixes the top-level folders (mlcache/, policies/, structures/, integrations/);
this file maps them into the single ``mlcache.*`` import namespace so users never write
``import structures``.
"""
from setuptools import setup

PACKAGES = {
    "mlcache": "mlcache",
    "mlcache.levels": "mlcache/levels",
    "mlcache.sim": "mlcache/sim",
    "mlcache.bench": "mlcache/bench",
    "mlcache.policies": "policies",
    "mlcache.structures": "structures",
    "mlcache.integrations": "integrations",
    "mlcache.integrations.spark": "integrations/spark",
}

setup(
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    package_data={"mlcache": ["py.typed"]},
)
