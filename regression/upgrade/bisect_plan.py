"""What ``bisect`` walks: the one package two requirement sets differ in, its releases, the halving.

Nothing here installs or runs anything (:mod:`nnx_pool.regression.upgrade.bisect` does):

* :func:`parse_set` reads a requirement set as ``rehearse`` takes it (``'jax==0.9.0'``,
  ``'jax==0.10.2 flax==0.12.8'``), each requirement parsed by
  :meth:`~nnx_pool.regression.upgrade.rehearse_plan.Requirement.parse`;
* :func:`find_span` finds the one package the good and the bad set differ in (jax and
  jaxlib count as one: a release of jax is installed with its jaxlib), and refuses two
  equal sets, two or more differing packages, a differing package without an exact
  ``==`` release on each side or named with other extras or markers on each, and a good
  release newer than the bad one (the sets swapped);
* :func:`parse_index` reads what ``pip index versions NAME -vv`` printed: the releases pip
  would install here and those it leaves out as yanked;
* :func:`releases_between` lists the registry's releases from the good one to the bad one
  (compared as :mod:`packaging` versions, so ``0.9.0.1`` comes between ``0.9.0`` and
  ``0.9.1``), pre-releases left out unless asked, yanked ones left out and named;
* :func:`partner_of` pairs each jax release with its jaxlib: the same version, else the
  newest jaxlib before it (jax 0.5.2 has no jaxlib 0.5.2 and installs with 0.5.1);
* :class:`Halving` halves the walk between the last good release and the first moved one,
  around releases that could not be installed or tested (as ``git bisect skip`` does).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from packaging.requirements import Requirement as Pep508
from packaging.specifiers import SpecifierSet
from packaging.utils import (
  InvalidSdistFilename,
  InvalidWheelFilename,
  parse_sdist_filename,
  parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from .rehearse_plan import (
  PAIRED,
  RehearsalError,
  Requirement,
  admits,
  normalise,
)

# The versions a step's line names beside the bisected package's (those the stamp leads with).
LABELLED = ("jax", "jaxlib", "flax")
_AVAILABLE = re.compile(r"^Available versions: (.*)$", re.M)
_YANKED = re.compile(r"Skipping link: yanked for reason: (.*): (\S+://\S+)")


def parse_set(text: str, flag: str) -> dict[str, Requirement]:
  """A requirement set, by normalised name: ``'jax==0.10.2 flax==0.12.8'``.

  Args:
    text: PEP 508 requirements separated by spaces (quoted as a shell would: one argument).
    flag: ``--good`` or ``--bad``, for the messages.

  Raises:
    RehearsalError: an empty set, a malformed requirement, or a package named twice.
  """
  try:
    words = shlex.split(text)
  except ValueError as e:
    raise RehearsalError(f"bisect: {flag} {text!r} cannot be read ({e}); give requirements "
                         "separated by spaces, e.g. 'jax==0.9.0 flax==0.12.6'.") from None
  if not words:
    raise RehearsalError(f"bisect: {flag} is empty; give the requirement set, e.g. "
                         f"{flag} 'jax==0.9.0'.")
  found: dict[str, Requirement] = {}
  for word in words:
    try:
      req = Requirement.parse(word)
    except RehearsalError as e:
      raise RehearsalError(f"bisect: {flag}: {str(e).removeprefix('rehearse: ')}") from None
    if req.name in found:
      raise RehearsalError(f"bisect: {flag} {text!r} names {req.name} twice "
                           f"({found[req.name].text} and {req.text}); name it once.")
    found[req.name] = req
  return found


@dataclasses.dataclass(frozen=True)
class Span:
  """The one package two requirement sets differ in, and what they share.

  Attributes:
    package: the package bisected (normalised): ``jax``, or ``flax``, ...
    good: its release in the good set.
    bad: its release in the bad set.
    partner: ``jaxlib`` for jax (``jax`` for jaxlib) when each release is installed with its
      partner's (:func:`partner_of`); None when the sets name the partner alike, or for
      another package.
    common: the requirements both sets hold, as pip reads them.
    forms: the good set's requirement of the package (and of the partner, where it names
      one), whose extras and marker every step keeps: ``jax[cuda12]==0.9.0``.
  """

  package: str
  good: Version
  bad: Version
  partner: str | None
  common: tuple[str, ...]
  forms: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def requirements(self, version: Version, partner: Version | None) -> list[str]:
    """The requirement set of one step: ``jax==0.9.2 jaxlib==0.9.2`` and the common ones, each
    with the extras and marker the sets give it (``jax[cuda12]==0.9.2``)."""
    pinned = [self._at(self.package, version)]
    if self.partner is not None and partner is not None:
      pinned.append(self._at(self.partner, partner))
    return [*pinned, *self.common]

  def _at(self, name: str, version: Version) -> str:
    req = Pep508(self.forms.get(name, name))
    req.specifier = SpecifierSet(f"=={version}")
    return str(req)


def _exact(req: Requirement | None, flag: str, name: str) -> Version:
  """The one release ``req`` names with ``==``; refuses anything else."""
  if req is None or req.exact is None:
    given = "does not name it" if req is None else f"has {req.text}"
    raise RehearsalError(f"bisect: {flag} {given}: bisect walks the releases of {name} from one "
                         f"exact release to another; name one with == on each side, e.g. "
                         f"{flag} '{name}==0.9.0'.")
  try:
    return Version(req.exact)
  except InvalidVersion:
    raise RehearsalError(f"bisect: {flag} {req.text}: {req.exact!r} is not a version PEP 440 "
                         "reads; name a release, e.g. 0.9.0.") from None


def find_span(good: Mapping[str, Requirement], bad: Mapping[str, Requirement]) -> Span:
  """The one package the good and the bad set differ in (see the module docstring).

  Args:
    good: the good set (:func:`parse_set`).
    bad: the bad set.

  Raises:
    RehearsalError: the sets are the same, differ in two or more packages, do not name
      an exact release of the differing package on each side, name it with other extras or
      markers, or name a good release newer than the bad one.
  """
  names = sorted(set(good) | set(bad))
  differ = [n for n in names if _same(good.get(n)) != _same(bad.get(n))]
  same = RehearsalError(f"bisect: --good and --bad are the same set "
                        f"({' '.join(r.text for r in good.values())}); name the release that "
                        "passes with --good and the one that moved with --bad.")
  if not differ:
    raise same
  packages = sorted({"jax" if n in PAIRED else n for n in differ})
  if len(packages) > 1:
    shown = ", ".join(f"{n} ({_side(good.get(n))} -> {_side(bad.get(n))})" for n in differ)
    raise RehearsalError(f"bisect: --good and --bad differ in {len(packages)} packages: {shown}; "
                         "bisect walks one package's releases. Give both sets the same "
                         "version of all but one (bisect that one first, then the next).")
  package = differ[0] if len(differ) == 1 else "jax"
  partner = PAIRED.get(package)
  if partner is not None and partner not in differ and partner in good:
    partner = None  # both sets name the same partner: it stays as named
  common = tuple(good[n].text for n in names if n not in differ and n != partner)
  for name in differ:
    _same_but_version(good.get(name), bad.get(name))
  forms = {n: good[n].text for n in (package, partner) if n is not None and n in good}
  span = Span(package, _exact(good.get(package), "--good", package),
              _exact(bad.get(package), "--bad", package), partner, common, forms)
  if span.good == span.bad and (partner is None or partner not in differ):
    raise same  # jax==0.9.0 and jax==0.9: the same release
  if span.good > span.bad:
    given = (" ".join(r.text for r in good.values()), " ".join(r.text for r in bad.values()))
    raise RehearsalError(
        f"bisect: --good {package}=={span.good} is newer than --bad {package}=={span.bad}: "
        "bisect walks from the older release, whose numbers are right, to the newer one that "
        f"moved them; swap --good and --bad: --good {_quoted(given[1])} --bad "
        f"{_quoted(given[0])}.")
  return span


def _same_but_version(good: Requirement | None, bad: Requirement | None) -> None:
  """Refuses a package the two sets name with other extras or markers: a step between them
  would install one of the two forms, and the change of form be blamed on a release."""
  if good is None or bad is None:
    return
  a, b = Pep508(good.text), Pep508(bad.text)
  if (a.extras, str(a.marker)) == (b.extras, str(b.marker)):
    return
  extras = f"[{','.join(sorted(a.extras | b.extras))}]" if a.extras | b.extras else ""
  marker = a.marker or b.marker
  fixed = [f"{a.name}{extras}{spec}" + (f"; {marker}" if marker else "")
           for spec in (a.specifier, b.specifier)]
  raise RehearsalError(
      f"bisect: --good names {good.text} and --bad {bad.text}: they differ in more than the "
      "release (extras or marker), and every step must install the same form; give both the "
      f"same, e.g. --good {_quoted(fixed[0])} --bad {_quoted(fixed[1])}.")


def _quoted(text: str) -> str:
  """A set as one shell argument, quoted as the docs write it: ``'jax==0.9.0'``."""
  return f"'{text}'" if "'" not in text else shlex.quote(text)


def _same(req: Requirement | None) -> tuple[str, object] | None:
  """What makes two requirements the same: the normalised name and the rest, as parsed."""
  if req is None:
    return None
  parsed = Pep508(req.text)
  return req.name, (sorted(parsed.extras), parsed.specifier, parsed.url, str(parsed.marker))


def _side(req: Requirement | None) -> str:
  return req.text if req is not None else "not named"


@dataclasses.dataclass(frozen=True)
class Listing:
  """A package's releases in the registry, as pip lists them for this interpreter.

  Attributes:
    versions: what pip would install (``pip index versions``: not yanked, a file for here).
    yanked: releases pip leaves out as yanked, with the reason their index gives.
  """

  versions: tuple[Version, ...]
  yanked: Mapping[Version, str] = dataclasses.field(default_factory=dict)


def _file_version(url: str) -> Version | None:
  """The version in a distribution file's name (a wheel or an sdist), from its URL."""
  name = unquote(PurePosixPath(urlsplit(url).path).name)
  try:
    return parse_wheel_filename(name)[1] if name.endswith(".whl") else parse_sdist_filename(name)[1]
  except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
    return None


def parse_index(output: str) -> Listing:
  """Reads ``pip index versions NAME -vv``: the ``Available versions`` line, the yanked links.

  Raises:
    RehearsalError: the output has no ``Available versions`` line.
  """
  found = _AVAILABLE.search(output)
  if found is None:
    raise RehearsalError("bisect: pip index versions printed no 'Available versions' line; "
                         "run it to see why.")
  versions = []
  for text in found.group(1).split(","):
    try:
      versions.append(Version(text.strip()))
    except InvalidVersion:
      continue  # a version pip lists but PEP 440 cannot order: not one bisect can place
  yanked = {}
  for reason, url in _YANKED.findall(output):
    version = _file_version(url)
    if version is not None and version not in versions:
      yanked[version] = "no reason given" if reason == "<none given>" else reason
  return Listing(tuple(sorted(set(versions))), yanked)


@dataclasses.dataclass(frozen=True)
class Walk:
  """The releases from the good one to the bad one, and what was left out of them.

  Attributes:
    releases: the good release first, the bad one last.
    left_out: one line per release between them that is not walked (yanked, pre-release).
  """

  releases: tuple[Version, ...]
  left_out: tuple[str, ...] = ()

  def steps(self) -> int:
    """The most checks the halving takes between the two ends (``ceil(log2(n - 1))``)."""
    return math.ceil(math.log2(len(self.releases) - 1))


def _nearest(listing: Listing, version: Version) -> str:
  below = [v for v in listing.versions if v < version]
  above = [v for v in listing.versions if v > version]
  near = [str(v) for v in (below[-1:] + above[:1])]
  return f"the nearest it serves: {', '.join(near)}" if near else "it serves none"


def releases_between(listing: Listing, span: Span, *, pre: bool = False) -> Walk:
  """The registry's releases of ``span.package`` from the good release to the bad one.

  Args:
    listing: the package's releases (:func:`parse_index`).
    span: the two ends (:func:`find_span`).
    pre: walk pre-releases (``0.10.0rc1``) too; by default they are left out, as pip leaves
      them out of ``>=`` requirements.

  Raises:
    RehearsalError: an end that the registry does not serve, or no release between them.
  """
  name = span.package
  for flag, end in (("--good", span.good), ("--bad", span.bad)):
    if end not in listing.versions and end not in listing.yanked:
      raise RehearsalError(f"bisect: {flag} {name}=={end} is not a release the registry serves "
                           f"here ({_nearest(listing, end)}).")
  low, high = span.good, span.bad
  inside = [v for v in listing.versions if low < v < high]
  walked = [v for v in inside if pre or not v.is_prerelease]
  left_out = [f"{name} {v} (a pre-release; --pre walks them)" for v in inside if v not in walked]
  left_out += [f"{name} {v} (yanked: {why})" for v, why in sorted(listing.yanked.items())
               if low < v < high]
  if not walked:
    also = f", besides {'; '.join(left_out)}" if left_out else ""
    raise RehearsalError(
        f"bisect: the registry has no release of {name} between {low} and {high}{also}: they "
        f"are neighbours, so if your check fails with {name} {span.bad} and passes with "
        f"{span.good}, {span.bad} is the release that moved it; there is nothing to bisect.")
  return Walk((low, *walked, high), tuple(left_out))


def partner_of(version: Version, partner: Listing) -> Version | None:
  """The partner release a release installs with: the same version, else the newest before it.

  jax 0.9.2 installs with jaxlib 0.9.2; jax 0.5.2, which has no jaxlib 0.5.2, with jaxlib
  0.5.1 (its own requirement reads ``jaxlib >=0.5.1, <=0.5.2``). None: no partner release
  at or before it.
  """
  if version in partner.versions:
    return version
  before = [v for v in partner.versions if v < version and not v.is_prerelease]
  return before[-1] if before else None


GOOD, MOVED, SKIP = "good", "moved", "skip"


@dataclasses.dataclass
class Halving:
  """The halving of a walk of ``count`` releases: index 0 good, ``count - 1`` moved.

  :meth:`next` names the release to check, the untried one nearest the middle of the last
  good and the first moved (the earlier of two as near); :meth:`mark` records its verdict
  (:data:`GOOD`, :data:`MOVED`, :data:`SKIP`). When :meth:`next` returns None, :attr:`good`
  is the last good release and :attr:`moved` the first moved one, unless one of
  :meth:`unsure` (releases between them that were skipped) moved first.
  """

  count: int
  good: int = 0
  moved: int = -1
  skipped: set[int] = dataclasses.field(default_factory=set)

  def __post_init__(self) -> None:
    if self.count < 2:
      raise ValueError(f"`count` must be 2 or more (a good and a moved release); got {self.count}")
    if self.moved < 0:
      self.moved = self.count - 1

  def next(self) -> int | None:
    """The release to check next, or None when the halving is done."""
    untried = [i for i in range(self.good + 1, self.moved) if i not in self.skipped]
    middle = (self.good + self.moved) / 2
    return min(untried, key=lambda i: (abs(i - middle), i)) if untried else None

  def mark(self, index: int, verdict: str) -> None:
    """Records the verdict of the release at ``index`` (one :meth:`next` named)."""
    if not self.good < index < self.moved:
      raise ValueError(f"`index` must lie between the last good release ({self.good}) and the "
                       f"first moved one ({self.moved}); got {index}")
    if verdict == GOOD:
      self.good = index
    elif verdict == MOVED:
      self.moved = index
    elif verdict == SKIP:
      self.skipped.add(index)
    else:
      raise ValueError(f"`verdict` must be {GOOD!r}, {MOVED!r} or {SKIP!r}; got {verdict!r}")

  def unsure(self) -> list[int]:
    """The skipped releases between the last good and the first moved: any may be the first."""
    return sorted(i for i in self.skipped if self.good < i < self.moved)


def label(package: str, version: Version | str, versions: Mapping[str, str | None]) -> str:
  """A release as a step names it: ``jax 0.10.0 (jaxlib 0.10.0, flax 0.12.6)``.

  Args:
    package: the package bisected.
    version: its release.
    versions: the versions installed where it ran (the others of :data:`LABELLED` are named).
  """
  others = [f"{n} {versions[n]}" for n in LABELLED if n != package and versions.get(n)]
  return f"{package} {version}" + (f" ({', '.join(others)})" if others else "")


def duration(seconds: float) -> str:
  """``42 s``, ``3 min 5 s``."""
  seconds = round(seconds)
  return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60} s"


def fits(requirements: Sequence[str], here: Mapping[str, str]) -> bool:
  """Whether the versions ``here`` satisfy every requirement (one naming a URL never does).

  Args:
    requirements: PEP 508 requirements, as :meth:`Span.requirements` gives them.
    here: installed versions by normalised name.
  """
  for text in requirements:
    req = Pep508(text)
    if req.url or not admits(req.specifier, here.get(normalise(req.name))):
      return False
  return True
