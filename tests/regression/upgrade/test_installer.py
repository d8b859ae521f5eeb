"""The installer of rehearsal environments: uv where it runs, else pip with the reason; and
pip's settings handed to uv (issue 39).

The choice and the translation are judged without installing anything; one test runs the real
uv (where it is installed) on hand-made wheels from a local simple index and a find-links
folder, standing in for a company mirror, in well under a second and without the network.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nnx_pool.regression.upgrade import installer, rehearse_cache, rehearse_env
from nnx_pool.regression.upgrade.installer import PipSettings, choose, pip_settings, uv_arguments
from nnx_pool.regression.upgrade.pip_messages import uv_failure
from nnx_pool.regression.upgrade.rehearse_plan import RehearsalError

UV = Path("/somewhere/bin/uv")


def _runs(version: str | None, why: str = ""):
  return lambda uv: (version, why)


def test_choose_takes_uv_where_it_runs_and_says_so():
  chosen = choose({}, find=lambda: UV, version=_runs("0.13.9"))
  assert (chosen.name, chosen.uv) == ("uv", UV)
  assert chosen.why == (f"installer: uv 0.13.9 ({UV}), environments linked from its cache")


def test_choose_falls_back_to_pip_naming_why_and_the_extra_that_brings_uv():
  chosen = choose({}, find=lambda: None, version=_runs("0.13.9"))
  assert (chosen.name, chosen.uv) == ("pip", None)
  assert chosen.why == ("installer: pip, slower than uv: uv is not installed "
                        "(pip install 'nnx-pool[upgrade]' brings it)")
  broken = choose({}, find=lambda: UV, version=_runs(None, "Exec format error"))
  assert broken.why == (f"installer: pip, slower than uv: uv at {UV} could not run: "
                        "Exec format error")


def test_choose_follows_nnx_pool_installer():
  assert choose({"NNX_POOL_INSTALLER": "pip"}, find=lambda: UV, version=_runs("0.13.9")).why == (
      "installer: pip (NNX_POOL_INSTALLER=pip)")
  assert choose({"NNX_POOL_INSTALLER": "UV"}, find=lambda: UV, version=_runs("0.1")).name == "uv"
  with pytest.raises(RehearsalError, match=r"NNX_POOL_INSTALLER=uv, but uv is not installed"):
    choose({"NNX_POOL_INSTALLER": "uv"}, find=lambda: None)
  with pytest.raises(RehearsalError, match=r"must be 'uv' or 'pip'; got 'conda'"):
    choose({"NNX_POOL_INSTALLER": "conda"})


# What `pip config list` printed on this project's machines (a user file, a global file and
# PIP_* variables), as pip writes it.
CONFIG_LIST = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///srv/pypi/simple file:///srv/pypi-extra/simple'
global.find-links='/srv/wheels'
install.find-links='/srv/install-wheels'
:env:.cert='/etc/ssl/env.pem'
:env:.default-timeout='180'
"""


def test_pip_settings_follow_pips_precedence_env_then_install_then_global():
  config = installer.read_config_list(CONFIG_LIST)
  assert config["global.extra-index-url"] == "file:///srv/pypi/simple file:///srv/pypi-extra/simple"
  settings = pip_settings(config, {"PIP_CONSTRAINT": "/etc/pip/pins.txt /etc/pip/more.txt"})
  assert settings == PipSettings(
      index_url=None,
      extra_index_urls=("file:///srv/pypi/simple", "file:///srv/pypi-extra/simple"),
      find_links=("/srv/install-wheels",),  # the install section over global
      cert="/etc/ssl/env.pem",  # a PIP_* variable (:env:) over the files
      constraints=("/etc/pip/pins.txt", "/etc/pip/more.txt"))  # this process's variable


def test_uv_arguments_carry_every_setting_and_pips_choice_among_indexes():
  settings = PipSettings(
      index_url="https://mirror.example/simple", extra_index_urls=("https://extra.example/simple",),
      find_links=("/srv/wheels",), no_index=False, cert="/etc/ca.pem", client_cert="/etc/me.pem",
      constraints=("/etc/pins.txt",), trusted_hosts=("mirror.example",))
  args, environ = uv_arguments(settings)
  assert args == ["--index-strategy", "unsafe-best-match",
                  "--index-url", "https://mirror.example/simple",
                  "--extra-index-url", "https://extra.example/simple",
                  "--find-links", "/srv/wheels", "--constraint", "/etc/pins.txt",
                  "--allow-insecure-host", "mirror.example"]
  assert environ == {"SSL_CERT_FILE": "/etc/ca.pem", "SSL_CLIENT_CERT": "/etc/me.pem"}
  assert uv_arguments(PipSettings(no_index=True))[0][-1] == "--no-index"


def test_uv_command_runs_uv_pip_for_the_environment_with_its_own_cache(tmp_path):
  command, environ = installer.uv_command(
      UV, tmp_path / "bin" / "python", ["install", "--no-deps", "--force-reinstall", "x"],
      PipSettings(cert="/etc/ca.pem"), tmp_path / "uv")
  assert command == [str(UV), "pip", "install", "--no-deps", "--reinstall", "x", "--python",
                     str(tmp_path / "bin" / "python"), "--index-strategy", "unsafe-best-match"]
  assert environ == {"SSL_CERT_FILE": "/etc/ca.pem", "UV_CACHE_DIR": str(tmp_path / "uv"),
                     "UV_NO_PROGRESS": "1"}


def test_uv_failure_is_its_resolvers_reason_naming_the_requirement():
  output = ("Using Python 3.11.7 environment at: /c/env\n"
            "  × No solution found when resolving dependencies:\n"
            "  ╰─▶ Because there is no version of jax==9.9 and you require jax==9.9, we can\n"
            "      conclude that your requirements are unsatisfiable.\n")
  assert uv_failure(output, ["jax==9.9", "flax"]) == (
      "rehearse: uv could not install jax==9.9: Because there is no version of jax==9.9 and you "
      "require jax==9.9, we can conclude that your requirements are unsatisfiable.")
  piped = ("error: No solution found when resolving dependencies\n"
           "cause: Because flax==0.12.8 depends on jax>=0.10.0 and nnx-pool==0.2.0 depends on "
           "flax==0.12.8, we can conclude that nnx-pool==0.2.0 depends on jax>=0.10.0.\n"
           "And because you require nnx-pool and jax==0.9.2, we can conclude that your "
           "requirements are unsatisfiable.\n")
  assert uv_failure(piped, ["jax==0.9.2"], {"flax": "0.12.8", "nnx-pool": "0.2.0"}) == (
      "rehearse: uv could not install jax==0.9.2: Because flax==0.12.8 depends on jax>=0.10.0 "
      "and nnx-pool==0.2.0 depends on flax==0.12.8, we can conclude that nnx-pool==0.2.0 depends "
      "on jax>=0.10.0. And because you require nnx-pool and jax==0.9.2, we can conclude that "
      "your requirements are unsatisfiable. (flax 0.12.8 is this environment's version; name a "
      "flax version too, or pass --resolve to let it choose one)")
  assert uv_failure("error: Failed to fetch: `https://x`\n", ["jax==9.9"]) == (
      "rehearse: uv could not install jax==9.9: Failed to fetch: `https://x`")


def test_copied_note_says_when_uv_could_not_link_from_its_cache(tmp_path):
  warning = "warning: Failed to hardlink files; falling back to full copy. This may lead to ..."
  assert "another filesystem" in (installer.copied_note(warning, tmp_path) or "")
  assert installer.copied_note("Installed 2 packages in 3ms", tmp_path) is None


def test_disk_use_counts_a_file_linked_from_elsewhere_apart_and_once(tmp_path):
  (tmp_path / "cache").mkdir()
  (tmp_path / "env").mkdir()
  (tmp_path / "cache" / "big").write_bytes(b"x" * 1000)
  os.link(tmp_path / "cache" / "big", tmp_path / "env" / "big")
  (tmp_path / "env" / "own").write_bytes(b"y" * 10)
  (tmp_path / "env" / "link").symlink_to(tmp_path / "env" / "own")
  assert rehearse_cache.disk_use([tmp_path / "env"]) == (10, 1000)
  assert rehearse_cache.disk_use([tmp_path / "env", tmp_path / "cache"]) == (10, 1000)


def test_uv_cache_dir_lies_beside_the_rehearsal_cache_and_is_private(tmp_path, monkeypatch):
  monkeypatch.setenv("NNX_POOL_CACHE", str(tmp_path / "c"))
  path = rehearse_cache.uv_cache_dir()
  assert path == tmp_path / "c" / "uv"
  if os.name == "posix":
    assert path.stat().st_mode & 0o777 == 0o700
    path.chmod(0o777)
    with pytest.raises(RehearsalError, match="may be written by its group and every user"):
      rehearse_cache.uv_cache_dir()


# ------------------------- hand-made wheels: a company mirror's stand-ins

def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
  """Writes ``name-version-py3-none-any.whl`` (one module, its RECORD hashed) into ``folder``."""
  folder.mkdir(parents=True, exist_ok=True)
  info = f"{name}-{version}.dist-info"
  files = {
      f"{name}/__init__.py": f"VERSION = {version!r}\n",
      f"{info}/METADATA": "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                   *(f"Requires-Dist: {r}\n" for r in requires)]),
      f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
                       "Tag: py3-none-any\n",
  }
  record = []
  for path, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
    record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
  files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
  target = folder / f"{name}-{version}-py3-none-any.whl"
  with zipfile.ZipFile(target, "w") as archive:
    for path, text in files.items():
      archive.writestr(path, text)
  return target


def simple_index(root: Path, wheels: list[Path]) -> str:
  """A PEP 503 simple index under ``root`` serving ``wheels``; its ``file://`` URL."""
  for path in wheels:
    project = root / path.name.split("-")[0]
    project.mkdir(parents=True, exist_ok=True)
    (project / path.name).write_bytes(path.read_bytes())
    page = project / "index.html"
    links = page.read_text() if page.exists() else ""
    page.write_text(links + f'<a href="{path.name}">{path.name}</a>\n')
  return root.as_uri()


def _real_uv() -> Path:
  uv = pytest.importorskip("uv", reason="uv is not installed (the upgrade extra)")
  return Path(uv.find_uv_bin())


def test_uv_installs_from_pips_index_extra_index_find_links_and_constraint(tmp_path, monkeypatch):
  # The index holds tinypkg 1.0, the extra index only 2.0 (which uv, by default, would take as
  # the only tinypkg), a find-links folder helper 0.3, and pip's constraint excludes 2.0.
  uv = _real_uv()
  index = simple_index(tmp_path / "index", [wheel(tmp_path / "w1", "tinypkg", "1.0")])
  extra = simple_index(tmp_path / "extra", [wheel(tmp_path / "w2", "tinypkg", "2.0")])
  wheel(tmp_path / "links", "helper", "0.3", ("tinypkg",))
  (tmp_path / "pins.txt").write_text("tinypkg<2\n")
  config = (f"global.index-url='{index}'\nglobal.extra-index-url='{extra}'\n"
            f"global.find-links='{tmp_path / 'links'}'\n"
            f"install.constraint='{tmp_path / 'pins.txt'}'\n")
  for name in [k for k in os.environ if k.startswith(("PIP_", "UV_"))]:
    monkeypatch.delenv(name)
  monkeypatch.setattr(rehearse_env, "pip_config_list",
                      lambda: installer.read_config_list(config))
  env, cache = tmp_path / "env", tmp_path / "uv-cache"
  subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable, str(env)], check=True,
                 env={**os.environ, "UV_CACHE_DIR": str(cache)})
  lines: list[str] = []
  code, output = rehearse_env.run_pip(env, ["install", "helper"], on_line=lines.append,
                                      uv=(uv, cache))
  assert code == 0, output
  assert rehearse_env.environment_versions(env) == {"helper": "0.3", "tinypkg": "1.0"}
  assert any("tinypkg==1.0" in line for line in lines)
