//! The operator's view of leases across all tenants (spec §9), computed here once: by the operator CLI (`anus`)
//! when it reads MongoDB directly, and by the brain's admin endpoints, which the CLI reads when it has no MongoDB
//! of its own (a brain on the embedded store, or an operator without database access).
//!
//! Every view is a snapshot of separate reads (holders, counters): a drift that is gone at the next read was an
//! acquisition or release in flight. Reconcile only acts on counters unchanged for its safety margin.

use std::collections::HashMap;

use lease_shared::store::{CounterKey, CounterRecord, HolderRecord};
use lease_shared::{LayeredDefinitions, LeaseDefinition, LeaseError, LeaseStore, StoreError};
use serde::{Deserialize, Serialize};

use crate::cluster::LeasePodLiveness;

/// Which holders a listing shows; every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderFilter {
    /// Only this tenant's holders.
    pub tenant: Option<String>,
    /// Only holders of this resource.
    pub resource: Option<String>,
    /// Only holders acquired by this pod.
    pub pod: Option<String>,
    /// Only holders of this handler type.
    #[serde(rename = "type")]
    pub lease_type: Option<String>,
}

impl HolderFilter {
    /// Whether `h` passes the filter.
    pub fn matches(&self, h: &HolderRecord) -> bool {
        let eq = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        eq(&self.tenant, &h.tenant_id)
            && eq(&self.resource, &h.resource)
            && eq(&self.pod, &h.pod)
            && eq(&self.lease_type, &h.lease_type)
    }
}

/// One holder as the operator sees it: the whole record (payload included) and what it means now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderRow {
    /// The stored holder.
    pub holder: HolderRecord,
    /// Whether the holder's pod is alive by the one liveness definition; `None` when the registry was unreadable.
    pub pod_alive: Option<bool>,
    /// Seconds since the last touch, by store time.
    pub idle_seconds: i64,
}

/// The holders passing `filter`, sorted by tenant, project, resource and token, each with its pod's liveness
/// (looked up once per pod).
pub async fn holders(
    store: &dyn LeaseStore,
    liveness: &LeasePodLiveness,
    filter: &HolderFilter,
) -> Result<Vec<HolderRow>, StoreError> {
    let now = store.store_now_ms().await?;
    let mut found = match (&filter.tenant, &filter.resource) {
        (Some(tenant), None) => store.tenant_holders(tenant).await?,
        (_, resource) => store.holders(resource.as_deref()).await?,
    };
    found.retain(|h| filter.matches(h));
    found.sort_by(|a, b| {
        (&a.tenant_id, &a.project_id, &a.resource, &a.token).cmp(&(&b.tenant_id, &b.project_id, &b.resource, &b.token))
    });
    let mut alive: HashMap<String, Option<bool>> = HashMap::new();
    let mut rows = Vec::with_capacity(found.len());
    for holder in found {
        let pod_alive = match alive.get(&holder.pod) {
            Some(known) => *known,
            None => {
                let known = liveness.is_alive(&holder.pod).await.ok();
                alive.insert(holder.pod.clone(), known);
                known
            }
        };
        rows.push(row(holder, pod_alive, now));
    }
    Ok(rows)
}

/// One holder, `None` if no holder has `token`.
pub async fn holder(
    store: &dyn LeaseStore,
    liveness: &LeasePodLiveness,
    token: &str,
) -> Result<Option<HolderRow>, StoreError> {
    let Some(holder) = store.holder(token).await? else { return Ok(None) };
    let now = store.store_now_ms().await?;
    let pod_alive = liveness.is_alive(&holder.pod).await.ok();
    Ok(Some(row(holder, pod_alive, now)))
}

fn row(holder: HolderRecord, pod_alive: Option<bool>, now_ms: i64) -> HolderRow {
    let idle_seconds = (now_ms - holder.last_seen_at_ms).max(0) / 1000;
    HolderRow { holder, pod_alive, idle_seconds }
}

/// One counter beside the holders booking it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterRow {
    /// The counter's `_id` (`<resource>|<level>|<scope>`).
    pub id: String,
    /// The counted resource.
    pub resource: String,
    /// `global`, `tenant`, `project` or `user` (empty for an `_id` outside the key scheme).
    pub level: String,
    /// `*`, `<tenant>`, `<tenant>/<project>` or `<tenant>/<user>`.
    pub scope: String,
    /// Slots taken according to the counter; 0 when the counter document does not exist.
    pub count: i64,
    /// Holders booking the counter (BOOKED): the value reconcile corrects the count to.
    pub booked: i64,
    /// `count - booked`: non-zero is drift from a crash window (or an acquisition in flight during the reads).
    pub drift: i64,
    /// False when holders book a counter that does not exist (reconcile reports it as missing).
    pub exists: bool,
}

/// How many of `holders` book each counter `_id` (what [`LeaseStore::booked_counts`] counts in the store).
pub fn booked_by(holders: &[HolderRecord]) -> HashMap<String, i64> {
    let mut booked = HashMap::new();
    for level in holders.iter().flat_map(|h| &h.levels) {
        *booked.entry(level.clone()).or_default() += 1;
    }
    booked
}

/// Rows for `counters` beside the holders `booked` per counter `_id`, sorted by `_id`; counters that holders book
/// but that do not exist are listed too. `keep` selects counters by key (e.g. a tenant's own levels).
pub fn counter_rows(
    counters: &[CounterRecord],
    booked: &HashMap<String, i64>,
    keep: impl Fn(&str, Option<&CounterKey>) -> bool,
) -> Vec<CounterRow> {
    let stored = counters.iter().map(|c| (c.id.as_str(), Some(c.count)));
    let missing = booked.keys().filter(|id| !counters.iter().any(|c| c.id == **id)).map(|id| (id.as_str(), None));
    let mut rows: Vec<CounterRow> = stored
        .chain(missing)
        .filter_map(|(id, count)| {
            let key = CounterKey::parse(id);
            if !keep(id, key.as_ref()) {
                return None;
            }
            let b = booked.get(id).copied().unwrap_or(0);
            let (resource, level, scope) = match key {
                Some(k) => (k.resource, k.level.as_str().to_owned(), k.scope),
                None => (id.to_owned(), String::new(), String::new()),
            };
            Some(CounterRow {
                id: id.to_owned(),
                resource,
                level,
                scope,
                count: count.unwrap_or(0),
                booked: b,
                drift: count.unwrap_or(0) - b,
                exists: count.is_some(),
            })
        })
        .collect();
    rows.sort_by(|a, b| a.id.cmp(&b.id));
    rows
}

/// Every counter (of `resource`, if given), global level included, with BOOKED and drift. The holders are
/// counted in the store (one aggregation, as reconcile counts them), read after the counters.
pub async fn counters(store: &dyn LeaseStore, resource: Option<&str>) -> Result<Vec<CounterRow>, StoreError> {
    let counters = store.counters(resource).await?;
    let booked = store.booked_counts().await?;
    let of_resource = |_: &str, k: Option<&CounterKey>| resource.is_none_or(|r| k.is_some_and(|k| k.resource == r));
    Ok(counter_rows(&counters, &booked, of_resource))
}

/// A merged definition as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefinitionView {
    /// The definition's name.
    pub name: String,
    /// The counted resource.
    pub resource: String,
    /// The caps; an absent level is pass-through.
    pub levels: LevelCaps,
    /// Idle time after which a holder is reaped.
    pub ttl_seconds: u64,
    /// How long an acquisition waits for a slot.
    pub wait_ms: u64,
    /// No level capped: acquisitions make no store call.
    pub noop: bool,
}

/// Caps per level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelCaps {
    /// Across all tenants.
    pub global: Option<u32>,
    /// Per tenant.
    pub tenant: Option<u32>,
    /// Per project.
    pub project: Option<u32>,
    /// Per user.
    pub user: Option<u32>,
}

impl From<LeaseDefinition> for DefinitionView {
    fn from(d: LeaseDefinition) -> Self {
        let l = d.levels;
        let levels = LevelCaps { global: l.global, tenant: l.tenant, project: l.project, user: l.user };
        let noop = [l.global, l.tenant, l.project, l.user].iter().all(Option::is_none);
        DefinitionView {
            name: d.name,
            resource: d.resource,
            levels,
            ttl_seconds: d.ttl_seconds,
            wait_ms: d.wait_ms,
            noop,
        }
    }
}

/// The merged definition `name` as an acquisition in `(tenant, project)` would see it now, every layer read anew
/// (the cache is neither used nor changed). `None` if no layer defines it.
pub async fn definition(
    layers: &LayeredDefinitions,
    tenant: &str,
    project: &str,
    name: &str,
) -> Result<Option<DefinitionView>, LeaseError> {
    Ok(layers.definition_uncached(tenant, project, name).await?.map(DefinitionView::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_shared::store::HolderState;

    fn holder(token: &str, tenant: &str, levels: &[&str]) -> HolderRecord {
        HolderRecord {
            token: token.into(),
            lease_type: "webhook".into(),
            lease: "l".into(),
            resource: "r".into(),
            tenant_id: tenant.into(),
            project_id: "p".into(),
            user_id: None,
            holder_ref: String::new(),
            pod: "pod-a".into(),
            pod_bound: false,
            state: HolderState::Held,
            levels: levels.iter().map(|l| (*l).to_owned()).collect(),
            payload: Default::default(),
            ttl_seconds: 60,
            acquired_at_ms: 0,
            last_seen_at_ms: 0,
        }
    }

    fn counter(id: &str, count: i64) -> CounterRecord {
        CounterRecord { id: id.into(), count, updated_at_ms: 0 }
    }

    #[test]
    fn counter_rows_show_booked_drift_and_missing_counters() {
        let holders = [holder("a", "t1", &["r|global|*", "r|tenant|t1"]), holder("b", "t2", &["r|global|*"])];
        let counters = [counter("r|global|*", 3), counter("r|tenant|t2", 0), counter("odd-id", 1)];
        let rows = counter_rows(&counters, &booked_by(&holders), |_, _| true);
        let view: Vec<(&str, i64, i64, i64, bool)> =
            rows.iter().map(|r| (r.id.as_str(), r.count, r.booked, r.drift, r.exists)).collect();
        assert_eq!(
            view,
            [
                ("odd-id", 1, 0, 1, true),
                ("r|global|*", 3, 2, 1, true),
                ("r|tenant|t1", 0, 1, -1, false),
                ("r|tenant|t2", 0, 0, 0, true),
            ]
        );
        assert_eq!((rows[1].level.as_str(), rows[1].scope.as_str()), ("global", "*"));
        assert_eq!(rows[0].level, "", "an id outside the key scheme has no level");
        let only_t1 =
            counter_rows(&counters, &booked_by(&holders), |_, k| k.is_some_and(|k| k.belongs_to_tenant("t1")));
        assert_eq!(only_t1.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r|tenant|t1"]);
    }

    #[test]
    fn a_filter_matches_only_what_every_set_field_names() {
        let h = holder("a", "t1", &[]);
        assert!(HolderFilter::default().matches(&h));
        assert!(
            HolderFilter { tenant: Some("t1".into()), pod: Some("pod-a".into()), ..Default::default() }.matches(&h)
        );
        assert!(
            !HolderFilter { tenant: Some("t1".into()), pod: Some("pod-b".into()), ..Default::default() }.matches(&h)
        );
        assert!(!HolderFilter { lease_type: Some("tex".into()), ..Default::default() }.matches(&h));
        assert!(!HolderFilter { resource: Some("x".into()), ..Default::default() }.matches(&h));
    }
}
