"""Fixtures for tests that drive a real Slurm 22.05 (tests/harness/slurm.py), loaded by conftest.py
as a pytest plugin.

    slurm_sites(**opts) -> a started SlurmSite (module scope; opts as SlurmSite's:
                           burst_buffer, burst_buffer_conf, lua_script, extra_conf);
                           the same opts give the same site within a module
    slurm_site          -> the module's plain site (no burst buffer)

Sites live under /tmp/spillway-tests-slurm-XXXX, use the session's private munged and are
stopped (daemons, job steps and tool calls killed) and removed at the end of the module,
also when tests failed; SPILLWAY_TEST_KEEP=1 keeps their directories. When a module had
failures, each site's log/ is copied to /tmp/spillway-tests-logs/.

Tests marked `slurm`, and tests using these fixtures, are skipped with the reason when the
Slurm packages are missing or the run is not root (slurmctld must switch to SlurmUser).
"""

import os
import shutil
import tempfile

import pytest

import slurm as S
import spwhelpers as H

SLURM_FIXTURES = ("slurm_sites", "slurm_site")


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: needs the Slurm daemons (tests/harness/slurm.py); skipped when they are not installed")


def _why_not():
    if os.geteuid() != 0:
        return "needs root (slurmctld runs as SlurmUser=slurm, jobs as the test users)"
    missing = S.slurm_missing()
    return missing


def pytest_collection_modifyitems(config, items):
    why = None
    for item in items:
        if item.get_closest_marker("slurm") or any(f in getattr(item, "fixturenames", ()) for f in SLURM_FIXTURES):
            why = why or _why_not() or ""
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="module")
def tools(spillway_bin, _local_base):
    """Copies of the tools Slurm runs, in a directory the SlurmUser can reach (the build
    tree may lie under a 0700 home)."""
    d = tempfile.mkdtemp(prefix="bin-", dir=_local_base)
    os.chmod(d, 0o755)
    for name in ("dw_wlm_cli", "dwstat"):
        shutil.copy2(os.path.join(os.path.dirname(spillway_bin), name), os.path.join(d, name))
        os.chmod(os.path.join(d, name), 0o755)
    return d


@pytest.fixture(scope="module")
def slurm_sites(request, munged, users):
    why = _why_not()
    if why:
        pytest.skip(why)
    cache = {}
    failed_before = request.session.testsfailed

    def get(**opts):
        return H.started_once(cache, repr(sorted(opts.items())),
                              lambda: S.SlurmSite(tempfile.mkdtemp(prefix=H.BASE_PREFIX + "slurm-"),
                                                  munged.socket, **opts),
                              lambda site: site.start(), "starting a Slurm site")

    yield get

    failed = request.session.testsfailed > failed_before
    for site in cache.values():
        stragglers = site.stop()
        if stragglers:
            print(f"\n[slurm] killed after stopping {site.dir}: " +
                  "; ".join(f"{pid} {cmd[:120]}" for pid, cmd in stragglers))
        if failed or getattr(site, "start_error", None):
            dest = H.kept_logs_dir(site.dir)
            shutil.copytree(site.log_dir, dest, dirs_exist_ok=True)
            print(f"\n[slurm] logs of {site.dir} kept in {dest}")
        if not H.KEEP:
            shutil.rmtree(site.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_site(slurm_sites):
    """The module's Slurm site without a burst buffer."""
    return slurm_sites()
