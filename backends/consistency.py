"""Cross-file checks: the two pools against each other, and the pools against the gateway's rules file.

Pure functions over already-validated objects; each returns :class:`Finding` lines. ``error`` findings make
``specgate backends check`` fail; ``warning`` findings are printed but do not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from backends.manifest import PoolManifest
from gateway.rules import RoutingRules

FindingLevel = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    level: FindingLevel
    message: str


def check_pair(standard: PoolManifest, speculative: PoolManifest) -> list[Finding]:
    """The two pools must serve the same model under the same name: routing must never change the answer."""
    findings = []
    if standard.model != speculative.model:
        findings.append(Finding("error", f"pools serve different models: standard {standard.model!r}, "
                                         f"speculative {speculative.model!r}"))
    if standard.served_model_name != speculative.served_model_name:
        findings.append(Finding("error", f"pools use different served_model_name: standard "
                                         f"{standard.served_model_name!r}, speculative "
                                         f"{speculative.served_model_name!r}"))
    if standard.max_model_len != speculative.max_model_len:
        findings.append(Finding("warning", f"max_model_len differs (standard {standard.max_model_len}, "
                                           f"speculative {speculative.max_model_len}): a long request may be "
                                           "accepted by one pool and rejected by the other"))
    return findings


def check_against_rules(manifests: Mapping[str, PoolManifest], rules: RoutingRules) -> list[Finding]:
    """Pool names, models and replica counts of the manifests against the rules file."""
    findings = []
    for name in sorted(set(manifests) - set(rules.pools)):
        findings.append(Finding("error", f"rules file has no pool {name!r} but a manifest defines it"))
    for name in sorted(set(rules.pools) - set(manifests)):
        findings.append(Finding("error", f"rules file names pool {name!r} but no manifest defines it"))
    for name, manifest in sorted(manifests.items()):
        if rules.models and manifest.served_model_name not in rules.models:
            findings.append(Finding("error", f"{name}: served_model_name {manifest.served_model_name!r} is not "
                                             f"in the rules file's models {list(rules.models)}"))
        urls = sum(len(pool.replicas) for pool_name, pool in rules.pools.items() if pool_name == name)
        if urls and urls != manifest.replicas:
            findings.append(Finding("warning", f"{name}: rules file lists {urls} replica URL(s), manifest "
                                               f"launches {manifest.replicas} replica(s)"))
    return findings
