//! The MongoDB store: production and every multi-pod deployment.
//!
//! Every primitive is exactly one command (one round trip). Time is MongoDB's: `$currentDate` on writes and
//! `$$NOW` in filters, never the pod's clock.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::TryStreamExt;
use mongodb::bson::{self, Bson, DateTime, Document, doc};
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database, IndexModel};

use super::{
    CounterKey, CounterRecord, DeleteCondition, HolderRecord, HolderState, LeaseStore, NewHolder, Occupancy, Payload,
    StoreResult,
};
use crate::error::StoreError;

/// The counters collection: one document per `(resource, level, scope)`.
pub const COUNTERS: &str = "resource_lease_counters";
/// The holders collection: one document per held (or pending) lease.
pub const HOLDERS: &str = "resource_lease_holders";

/// Server error codes the store reacts to, in one place.
mod codes {
    /// E11000: a concurrent upsert inserted the same `_id` first.
    pub(super) const DUPLICATE_KEY: i32 = 11000;
}

/// Server selection timeout when the URI sets none: long enough for an election, short enough that an acquisition
/// on a dead store fails within a caller's patience rather than the driver's default 30 s.
const DEFAULT_SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(5);

fn store_error(operation: &'static str) -> impl Fn(mongodb::error::Error) -> StoreError {
    move |e| StoreError::new(operation, e)
}

fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == codes::DUPLICATE_KEY,
        ErrorKind::Command(c) => c.code == codes::DUPLICATE_KEY,
        _ => false,
    }
}

/// `lastSeenAt + ttlSeconds < $$NOW`, evaluated by the server.
fn idle_expr() -> Document {
    doc! { "$expr": { "$lt": [ { "$add": ["$lastSeenAt", { "$multiply": ["$ttlSeconds", 1000] }] }, "$$NOW" ] } }
}

/// The MongoDB [`LeaseStore`].
#[derive(Debug, Clone)]
pub struct MongoStore {
    database: Database,
    counters: Collection<Document>,
    holders: Collection<Document>,
}

impl MongoStore {
    /// A store on `database`. Touches no network: an unreachable server shows up as `LEASE_UNAVAILABLE` on use.
    pub fn new(database: &Database) -> Self {
        MongoStore {
            database: database.clone(),
            counters: database.collection(COUNTERS),
            holders: database.collection(HOLDERS),
        }
    }

    /// Parses `uri` and opens a client (lazily connected); a URI without `serverSelectionTimeoutMS` gets 5 s.
    pub async fn connect(uri: &str, database: &str) -> Result<(Client, Self), StoreError> {
        let mut options = ClientOptions::parse(uri).await.map_err(store_error("connect"))?;
        options.server_selection_timeout.get_or_insert(DEFAULT_SERVER_SELECTION_TIMEOUT);
        options.app_name.get_or_insert_with(|| "lease".to_owned());
        let client = Client::with_options(options).map_err(store_error("connect"))?;
        let store = Self::new(&client.database(database));
        Ok((client, store))
    }

    /// Creates the indexes the scans rely on (holders by booked counter, resource, pod and tenant). Idempotent.
    pub async fn ensure_indexes(&self) -> StoreResult<()> {
        let indexes =
            ["levels", "resource", "pod", "tenantId"].map(|f| IndexModel::builder().keys(doc! { f: 1 }).build());
        self.holders.create_indexes(indexes).await.map_err(store_error("ensure_indexes"))?;
        Ok(())
    }
}

impl MongoStore {
    async fn find_holders(&self, filter: Document, op: &'static str) -> StoreResult<Vec<HolderRecord>> {
        let docs: Vec<Document> =
            self.holders.find(filter).await.map_err(store_error(op))?.try_collect().await.map_err(store_error(op))?;
        Ok(docs.into_iter().map(holder_from).collect())
    }

    async fn find_counters(&self, filter: Document, op: &'static str) -> StoreResult<Vec<CounterRecord>> {
        let docs: Vec<Document> =
            self.counters.find(filter).await.map_err(store_error(op))?.try_collect().await.map_err(store_error(op))?;
        Ok(docs.iter().map(counter_from).collect())
    }
}

fn counter_from(d: &Document) -> CounterRecord {
    CounterRecord { id: text(d, "_id"), count: int(d, "count"), updated_at_ms: millis(d, "updatedAt") }
}

fn to_bson_payload(payload: &Payload) -> StoreResult<Document> {
    bson::to_document(payload).map_err(|e| StoreError::new("payload", e))
}

fn millis(d: &Document, field: &str) -> i64 {
    d.get_datetime(field).map_or(0, |t| t.timestamp_millis())
}

fn int(d: &Document, field: &str) -> i64 {
    match d.get(field) {
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Double(v)) => *v as i64,
        _ => 0,
    }
}

fn text(d: &Document, field: &str) -> String {
    d.get_str(field).unwrap_or_default().to_owned()
}

fn holder_from(d: Document) -> HolderRecord {
    let payload = match Bson::Document(d.get_document("payload").cloned().unwrap_or_default()).into_relaxed_extjson() {
        serde_json::Value::Object(map) => map,
        _ => Payload::new(),
    };
    HolderRecord {
        token: text(&d, "_id"),
        lease_type: text(&d, "type"),
        lease: text(&d, "lease"),
        resource: text(&d, "resource"),
        tenant_id: text(&d, "tenantId"),
        project_id: text(&d, "projectId"),
        user_id: d.get_str("userId").ok().map(str::to_owned),
        holder_ref: text(&d, "holderRef"),
        pod: text(&d, "pod"),
        pod_bound: d.get_bool("podBound").unwrap_or(false),
        state: HolderState::parse(d.get_str("state").unwrap_or_default()),
        levels: d
            .get_array("levels")
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default(),
        payload,
        ttl_seconds: int(&d, "ttlSeconds").max(0) as u64,
        acquired_at_ms: millis(&d, "acquiredAt"),
        last_seen_at_ms: millis(&d, "lastSeenAt"),
    }
}

/// `{_id: token}`, plus the tenant when the caller is bound to one.
fn holder_filter(token: &str, tenant: Option<&str>) -> Document {
    let mut filter = doc! { "_id": token };
    if let Some(t) = tenant {
        filter.insert("tenantId", t);
    }
    filter
}

fn resource_filter(resource: Option<&str>) -> Document {
    resource.map_or_else(Document::new, |r| doc! { "resource": r })
}

/// The compare-and-set filter of reconcile: the counter as it was read, count and `updatedAt` both.
fn unchanged_filter(expected: &CounterRecord) -> Document {
    doc! {
        "_id": &expected.id,
        "count": expected.count,
        "updatedAt": DateTime::from_millis(expected.updated_at_ms),
    }
}

#[async_trait]
impl LeaseStore for MongoStore {
    async fn insert_holder(&self, h: &NewHolder) -> StoreResult<()> {
        // An upsert, so that `$currentDate` stamps creation with server time.
        let set_on_insert = doc! {
            "type": &h.lease_type,
            "lease": &h.lease,
            "resource": &h.resource,
            "tenantId": &h.tenant_id,
            "projectId": &h.project_id,
            "userId": h.user_id.as_deref().map_or(Bson::Null, Bson::from),
            "holderRef": &h.holder_ref,
            "pod": &h.pod,
            "podBound": h.pod_bound,
            "state": HolderState::Pending.as_str(),
            "levels": [],
            "payload": to_bson_payload(&h.payload)?,
            "ttlSeconds": h.ttl_seconds as i64,
        };
        self.holders
            .update_one(
                doc! { "_id": &h.token },
                doc! { "$setOnInsert": set_on_insert, "$currentDate": { "acquiredAt": true, "lastSeenAt": true } },
            )
            .upsert(true)
            .await
            .map_err(store_error("insert_holder"))?;
        Ok(())
    }

    async fn try_increment(&self, key: &CounterKey, cap: u32) -> StoreResult<bool> {
        let r = self
            .counters
            .update_one(
                doc! { "_id": key.id(), "count": { "$lt": i64::from(cap) } },
                doc! { "$inc": { "count": 1_i64 }, "$currentDate": { "updatedAt": true } },
            )
            .await
            .map_err(store_error("try_increment"))?;
        Ok(r.matched_count == 1)
    }

    async fn ensure_counter(&self, key: &CounterKey) -> StoreResult<()> {
        // A pure `_id` filter: the server retries the duplicate-key race of concurrent first uses itself. An update
        // pipeline, because `$setOnInsert` cannot take `$$NOW` and `$currentDate` would move an existing counter's
        // `updatedAt` (see the trait): every field is only filled in where missing.
        let keep_or = |field: &str, value: Bson| doc! { "$ifNull": [format!("${field}"), { "$literal": value }] };
        let r = self
            .counters
            .update_one(
                doc! { "_id": key.id() },
                vec![doc! { "$set": {
                    "resource": keep_or("resource", key.resource.as_str().into()),
                    "level": keep_or("level", key.level.as_str().into()),
                    "scope": keep_or("scope", key.scope.as_str().into()),
                    "count": keep_or("count", 0_i64.into()),
                    "updatedAt": { "$ifNull": ["$updatedAt", "$$NOW"] },
                } }],
            )
            .upsert(true)
            .await;
        match r {
            Ok(_) => Ok(()),
            // Another first user created it between our attempts: exactly what we wanted.
            Err(e) if is_duplicate_key(&e) => Ok(()),
            Err(e) => Err(StoreError::new("ensure_counter", e)),
        }
    }

    async fn push_level(&self, token: &str, counter_id: &str, held: bool) -> StoreResult<bool> {
        let mut update = doc! { "$push": { "levels": counter_id } };
        if held {
            update.insert("$set", doc! { "state": HolderState::Held.as_str() });
        }
        let r = self.holders.update_one(doc! { "_id": token }, update).await.map_err(store_error("push_level"))?;
        Ok(r.matched_count == 1)
    }

    async fn touch(&self, token: &str, tenant: Option<&str>) -> StoreResult<bool> {
        let r = self
            .holders
            .update_one(holder_filter(token, tenant), doc! { "$currentDate": { "lastSeenAt": true } })
            .await
            .map_err(store_error("touch"))?;
        Ok(r.matched_count == 1)
    }

    async fn touch_in_tenant(&self, token: &str, tenant: &str) -> StoreResult<Option<String>> {
        let before = self
            .holders
            .find_one_and_update(holder_filter(token, Some(tenant)), doc! { "$currentDate": { "lastSeenAt": true } })
            .projection(doc! { "resource": 1 })
            .await
            .map_err(store_error("touch_in_tenant"))?;
        Ok(before.map(|d| d.get_str("resource").unwrap_or_default().to_owned()))
    }

    async fn set_payload(&self, token: &str, tenant: Option<&str>, payload: &Payload) -> StoreResult<bool> {
        let r = self
            .holders
            .update_one(
                holder_filter(token, tenant),
                doc! { "$set": { "payload": to_bson_payload(payload)? }, "$currentDate": { "lastSeenAt": true } },
            )
            .await
            .map_err(store_error("set_payload"))?;
        Ok(r.matched_count == 1)
    }

    async fn delete_holder(&self, token: &str, condition: DeleteCondition<'_>) -> StoreResult<Option<HolderRecord>> {
        let mut filter = doc! { "_id": token };
        match condition {
            DeleteCondition::Any => {}
            DeleteCondition::Tenant(t) => {
                filter.insert("tenantId", t);
            }
            DeleteCondition::Idle => filter.extend(idle_expr()),
            DeleteCondition::Pod(p) => {
                filter.insert("pod", p);
            }
        }
        let d = self.holders.find_one_and_delete(filter).await.map_err(store_error("delete_holder"))?;
        Ok(d.map(holder_from))
    }

    async fn decrement(&self, counter_ids: &[String]) -> StoreResult<()> {
        let update = doc! { "$inc": { "count": -1_i64 }, "$currentDate": { "updatedAt": true } };
        let result = match counter_ids {
            [] => return Ok(()),
            // One counter: the `_id`-only fast path instead of a multi-document `$in` update.
            [id] => self.counters.update_one(doc! { "_id": id }, update).await,
            ids => self.counters.update_many(doc! { "_id": { "$in": ids } }, update).await,
        };
        result.map_err(store_error("decrement"))?;
        Ok(())
    }

    async fn idle_holders(&self, resource: Option<&str>) -> StoreResult<Vec<String>> {
        let mut filter = resource_filter(resource);
        filter.extend(idle_expr());
        let docs: Vec<Document> = self
            .holders
            .find(filter)
            .projection(doc! { "_id": 1 })
            .await
            .map_err(store_error("idle_holders"))?
            .try_collect()
            .await
            .map_err(store_error("idle_holders"))?;
        Ok(docs.iter().map(|d| text(d, "_id")).collect())
    }

    async fn tenant_holders(&self, tenant: &str) -> StoreResult<Vec<HolderRecord>> {
        self.find_holders(doc! { "tenantId": tenant }, "tenant_holders").await
    }

    async fn tenant_counters(&self, tenant: &str) -> StoreResult<Vec<CounterRecord>> {
        // `<tenant>/…` as a range ('0' follows '/'), so a tenant id needs no regex escaping.
        let filter = doc! {
            "level": { "$ne": "global" },
            "$or": [
                { "scope": tenant },
                { "scope": { "$gte": format!("{tenant}/"), "$lt": format!("{tenant}0") } },
            ],
        };
        self.find_counters(filter, "tenant_counters").await
    }

    async fn counter_count(&self, key: &CounterKey) -> StoreResult<Option<i64>> {
        let d = self
            .counters
            .find_one(doc! { "_id": key.id() })
            .projection(doc! { "count": 1 })
            .await
            .map_err(store_error("counter_count"))?;
        Ok(d.map(|d| int(&d, "count")))
    }

    async fn occupancy(&self, key: &CounterKey) -> StoreResult<Occupancy> {
        let id = key.id();
        let count = self
            .counters
            .find_one(doc! { "_id": &id })
            .await
            .map_err(store_error("occupancy"))?
            .map_or(0, |d| int(&d, "count"));
        let pipeline = [
            doc! { "$match": { "levels": &id } },
            doc! { "$group": {
                "_id": Bson::Null,
                "expires": { "$min": { "$add": ["$lastSeenAt", { "$multiply": ["$ttlSeconds", 1000] }] } },
            } },
            doc! { "$project": { "ms": { "$subtract": ["$expires", "$$NOW"] } } },
        ];
        let first: Option<Document> = self
            .holders
            .aggregate(pipeline)
            .await
            .map_err(store_error("occupancy"))?
            .try_next()
            .await
            .map_err(store_error("occupancy"))?;
        Ok(Occupancy { count, retry_after_ms: first.map(|d| int(&d, "ms").max(0) as u64) })
    }

    async fn holder(&self, token: &str) -> StoreResult<Option<HolderRecord>> {
        let d = self.holders.find_one(doc! { "_id": token }).await.map_err(store_error("holder"))?;
        Ok(d.map(holder_from))
    }

    async fn holders(&self, resource: Option<&str>) -> StoreResult<Vec<HolderRecord>> {
        self.find_holders(resource_filter(resource), "holders").await
    }

    async fn counters(&self, resource: Option<&str>) -> StoreResult<Vec<CounterRecord>> {
        self.find_counters(resource_filter(resource), "counters").await
    }

    async fn store_now_ms(&self) -> StoreResult<i64> {
        // `hello` reports the server's clock (`localTime`): the clock `$currentDate` and `$$NOW` read. It goes to
        // the primary like every write, needs no collection and no privileges beyond connecting.
        let reply = self.database.run_command(doc! { "hello": 1 }).await.map_err(store_error("store_now"))?;
        reply
            .get_datetime("localTime")
            .map(|t| t.timestamp_millis())
            .map_err(|e| StoreError::new("store_now", format!("hello without localTime: {e}")))
    }

    async fn holder_pods(&self) -> StoreResult<Vec<String>> {
        let values = self.holders.distinct("pod", doc! {}).await.map_err(store_error("holder_pods"))?;
        let mut pods: Vec<String> = values.into_iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
        pods.sort();
        Ok(pods)
    }

    async fn pod_holders(&self, pod: &str) -> StoreResult<Vec<String>> {
        let docs: Vec<Document> = self
            .holders
            .find(doc! { "pod": pod })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(store_error("pod_holders"))?
            .try_collect()
            .await
            .map_err(store_error("pod_holders"))?;
        Ok(docs.iter().map(|d| text(d, "_id")).collect())
    }

    async fn booked_counts(&self) -> StoreResult<HashMap<String, i64>> {
        let pipeline = [
            doc! { "$project": { "levels": 1 } },
            doc! { "$unwind": "$levels" },
            doc! { "$group": { "_id": "$levels", "n": { "$sum": 1 } } },
        ];
        let docs: Vec<Document> = self
            .holders
            .aggregate(pipeline)
            .await
            .map_err(store_error("booked_counts"))?
            .try_collect()
            .await
            .map_err(store_error("booked_counts"))?;
        Ok(docs.iter().map(|d| (text(d, "_id"), int(d, "n"))).collect())
    }

    async fn set_counter_if_unchanged(&self, expected: &CounterRecord, count: i64) -> StoreResult<bool> {
        let r = self
            .counters
            .update_one(
                unchanged_filter(expected),
                doc! { "$set": { "count": count }, "$currentDate": { "updatedAt": true } },
            )
            .await
            .map_err(store_error("set_counter_if_unchanged"))?;
        Ok(r.matched_count == 1)
    }

    async fn delete_counter_if_unchanged(&self, expected: &CounterRecord) -> StoreResult<bool> {
        let r = self
            .counters
            .delete_one(unchanged_filter(expected))
            .await
            .map_err(store_error("delete_counter_if_unchanged"))?;
        Ok(r.deleted_count == 1)
    }
}
