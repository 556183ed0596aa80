//! Test support shared by the lease-shared test suites: the real MongoDB, fixtures over both stores, and the
//! fault-injecting store wrapper.

#![allow(dead_code, unreachable_pub)]

pub mod faulty;
pub mod proxy;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lease_shared::store::{LeaseStore, ManualClock, MemoryStore, MongoStore};
use lease_shared::{
    DefinitionSource, LeaseDefinition, LeaseRef, LeaseRequest, LeaseRevocationListener, ResourceLeaseService,
    StaticDefinitions,
};
use mongodb::bson::doc;

pub use faulty::FaultyStore;

/// The environment variable naming the test MongoDB; `scripts/test.sh` sets it.
pub const MONGODB_URI_VAR: &str = "LEASE_TEST_MONGODB_URI";

/// A fresh database on the test MongoDB, unique to this test. Fails loudly, saying how to get a MongoDB, when
/// none is configured or reachable: a Mongo test never skips silently.
pub async fn mongo_database(test: &str) -> mongodb::Database {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let uri = std::env::var(MONGODB_URI_VAR).unwrap_or_else(|_| {
        panic!(
            "{MONGODB_URI_VAR} is not set: run the tests with scripts/test.sh (it installs and starts a real \
             mongod), or point {MONGODB_URI_VAR} at a MongoDB you run"
        )
    });
    let mut options = mongodb::options::ClientOptions::parse(&uri).await.expect("parse the test MongoDB URI");
    options.server_selection_timeout = Some(Duration::from_secs(10));
    let client = mongodb::Client::with_options(options).expect("client for the test MongoDB");
    let name =
        format!("lt_{}_{}_{}", &test[..test.len().min(30)], std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst));
    let db = client.database(&name);
    if let Err(e) = db.run_command(doc! { "ping": 1 }).await {
        panic!("the test MongoDB at {uri} ({MONGODB_URI_VAR}) does not answer: {e}; scripts/test.sh starts one");
    }
    db
}

/// Which store a conformance test runs on.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    /// The in-memory store on a manual clock.
    Memory,
    /// The real MongoDB, a fresh database per test.
    Mongo(&'static str),
}

/// A store under test, wrapped in the counting and fault-injecting [`FaultyStore`].
pub struct Fixture {
    pub store: Arc<FaultyStore>,
    pub raw: Arc<dyn LeaseStore>,
    pub db: Option<mongodb::Database>,
    pub clock: Option<ManualClock>,
}

impl Fixture {
    pub async fn new(backend: Backend) -> Self {
        let (raw, db, clock): (Arc<dyn LeaseStore>, _, _) = match backend {
            Backend::Memory => {
                let clock = ManualClock::new(1_700_000_000_000);
                (Arc::new(MemoryStore::new(Arc::new(clock.clone()))), None, Some(clock))
            }
            Backend::Mongo(test) => {
                let db = mongo_database(test).await;
                let store = MongoStore::new(&db);
                store.ensure_indexes().await.expect("indexes");
                (Arc::new(store), Some(db), None)
            }
        };
        Fixture { store: Arc::new(FaultyStore::new(raw.clone())), raw, db, clock }
    }

    /// A second store handle on the same data (a second pod): a new client for MongoDB.
    pub async fn second_store(&self) -> Arc<dyn LeaseStore> {
        match &self.db {
            None => self.raw.clone(),
            Some(db) => {
                let uri = std::env::var(MONGODB_URI_VAR).expect("uri");
                let (_client, store) = MongoStore::connect(&uri, db.name()).await.expect("second client");
                Arc::new(store)
            }
        }
    }

    /// A service over the fixture's (counting) store.
    pub fn service(&self, defs: &[LeaseDefinition]) -> ResourceLeaseService {
        service_on(self.store.clone(), defs, None)
    }

    /// Lets `ms` of store time pass: the manual clock moves, or the test sleeps for MongoDB's server time.
    pub async fn pass_time(&self, ms: u64) {
        match &self.clock {
            Some(c) => c.advance(ms as i64),
            None => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }

    /// Number of holders booking each counter, straight from the store.
    pub async fn booked(&self) -> HashMap<String, i64> {
        let mut booked = HashMap::new();
        for h in self.raw.holders(None).await.expect("holders") {
            for l in h.levels {
                *booked.entry(l).or_insert(0) += 1;
            }
        }
        booked
    }

    /// Counter counts, straight from the store.
    pub async fn counts(&self) -> HashMap<String, i64> {
        self.raw.counters(None).await.expect("counters").into_iter().map(|c| (c.id, c.count)).collect()
    }

    /// Asserts that every counter equals the number of holders booking it (a missing counter counts as 0).
    pub async fn assert_counters_match_holders(&self) {
        let booked = self.booked().await;
        let counts = self.counts().await;
        for (id, n) in &counts {
            assert_eq!(*n, booked.get(id).copied().unwrap_or(0), "counter {id} drifted from its booked holders");
        }
        for (id, n) in &booked {
            assert_eq!(counts.get(id).copied().unwrap_or(0), *n, "holders book {id} beyond its counter");
        }
    }

    pub async fn drop_database(self) {
        if let Some(db) = self.db {
            let _ = db.drop().await;
        }
    }
}

/// A service over `store` with `defs`, accepting the types `test`, `tex` and `mcp`.
pub fn service_on(
    store: Arc<dyn LeaseStore>,
    defs: &[LeaseDefinition],
    listener: Option<Arc<dyn LeaseRevocationListener>>,
) -> ResourceLeaseService {
    let definitions: Arc<dyn DefinitionSource> = Arc::new(StaticDefinitions::new(defs.iter().cloned()));
    let types: HashSet<String> = ["test", "tex", "mcp"].map(String::from).into();
    ResourceLeaseService::new(store, definitions, Arc::new(types), listener)
}

/// A definition from YAML; the name is taken from the document.
pub fn def(yaml: &str) -> LeaseDefinition {
    let name = yaml.lines().find_map(|l| l.strip_prefix("name: ")).expect("name line").trim();
    LeaseDefinition::from_yaml(name, yaml).expect("valid definition")
}

/// A request of type `test` for the named lease.
pub fn request(lease: &str, tenant: &str, project: &str, user: &str) -> LeaseRequest {
    LeaseRequest::new("test", LeaseRef::Name(lease.to_owned()), tenant, project)
        .user(user)
        .holder_ref("test-holder")
        .pod("pod-a", true)
}

/// Declares each listed async test fn (taking a [`Backend`]) once per store.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::support::Backend::Memory).await
                }
            )*
        }
        mod mongo {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::support::Backend::Mongo(stringify!($name))).await
                }
            )*
        }
    };
}
