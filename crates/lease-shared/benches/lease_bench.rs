//! `lease-bench`: what a lease costs against a real MongoDB, measured against the raw round trip it is built from.
//!
//! Run it with `scripts/bench.sh` (it starts a throwaway mongod, or uses `LEASE_BENCH_MONGODB_URI` /
//! `LEASE_TEST_MONGODB_URI`). One run prints, in one table:
//! 1. the raw round trip (`update_one` `$inc` on one document by `_id`), p50 / p99;
//! 2. round trips per uncontended acquire / check / release, counted by a command monitor;
//! 3. latency of acquire / check / release for a 3-level definition, against the round-trip budget;
//! 4. throughput under contention (64 tasks over 2 services, one hot counter) against the raw conditional-update
//!    rate at the same concurrency, and the same funnel with a cap of 8 so that most acquisitions wait;
//! 5. the machine.
//!
//! The bench works in a fresh database of its own (unique name) and drops it at the end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::error::Error;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lease_shared::store::{COUNTERS, CounterKey, DeleteCondition, HOLDERS, NewHolder};
use lease_shared::{
    LeaseDefinition, LeaseError, LeaseRef, LeaseRequest, LeaseStore, Level, MongoStore, Payload, ResourceLeaseService,
    StaticDefinitions,
};
use mongodb::bson::{Document, doc};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Where the MongoDB URI comes from, first match wins.
const URI_VARS: [&str; 2] = ["LEASE_BENCH_MONGODB_URI", "LEASE_TEST_MONGODB_URI"];

/// Sequential operations before any measurement (connection set-up, counters created, caches warm).
const WARMUP_OPS: usize = 200;
/// Sequential raw round trips measured.
const RAW_OPS: usize = 2000;
/// Sequential acquire / check / release triples whose round trips are counted.
const COUNT_ITERS: usize = 100;
/// Sequential acquire / check / release triples whose latency is measured.
const LATENCY_ITERS: usize = 1000;
/// Concurrent tasks under contention, spread round-robin over `PODS` services (each with its own client).
const TASKS: usize = 64;
/// Services ("pods") under contention, each with its own `mongodb::Client`.
const PODS: usize = 2;
/// Contention runs: unmeasured ramp-up, then the measured window.
const CONTENTION_WARMUP: Duration = Duration::from_secs(1);
const CONTENTION_WINDOW: Duration = Duration::from_secs(5);
/// The filter bound of the raw conditional update: never reached.
const HUGE: i64 = 1 << 60;
/// Budget of the latency target: acquire p50 ≤ LATENCY_SLACK × (round trips × round-trip p50).
const LATENCY_SLACK: f64 = 1.25;
/// Efficiency target under contention.
const EFFICIENCY_TARGET: f64 = 0.8;

/// Handshake and monitoring commands: not round trips of the operation under test.
const IGNORED_COMMANDS: [&str; 8] =
    ["hello", "isMaster", "ping", "endSessions", "saslStart", "saslContinue", "getnonce", "authenticate"];

/// The handler type every bench lease uses.
const TYPE: &str = "bench";
/// Three capped levels, caps never reached: the uncontended funnel.
const DEF_3_LEVELS: (&str, &str) =
    ("bench", "name: bench\nlevels: {global: 1000000, tenant: 1000000, project: 1000000}\nttlSeconds: 60\n");
/// One global level with a cap of 64: all 64 tasks are admitted, all contend on one counter document.
const DEF_HOT_64: (&str, &str) = ("hot64", "name: hot64\nlevels: {global: 64}\nttlSeconds: 60\nwaitMs: 60000\n");
/// One global level with a cap of 8: most of the 64 tasks must wait; waitMs so long that nothing fails.
const DEF_HOT_8: (&str, &str) = ("hot8", "name: hot8\nlevels: {global: 8}\nttlSeconds: 60\nwaitMs: 600000\n");

fn main() {
    // `cargo test --benches` / `--all-targets` runs a harness-less bench without `--bench`: nothing to test here.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "lease-bench: not started by `cargo bench` (no --bench flag); skipping. Run it with scripts/bench.sh"
        );
        return;
    }
    let Some(uri) = URI_VARS.iter().find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty())) else {
        eprintln!(
            "lease-bench: no MongoDB: neither {} is set.\n  Run the benchmark with scripts/bench.sh: it starts a \
             throwaway mongod (or uses the one a URI variable names).",
            URI_VARS.join(" nor ")
        );
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    if let Err(e) = runtime.block_on(bench(&uri)) {
        eprintln!("lease-bench: FAILED: {e}");
        std::process::exit(1);
    }
}

/// Counts the commands a client sends (`CommandEvent::Started`), and, when asked, how many funnel passes (holder
/// inserts) each holder reference took.
#[derive(Debug, Default)]
struct Monitor {
    /// Whether started commands are logged (sequential phases only).
    recording: AtomicBool,
    /// `<collection>.<command>` of every counted command since the last `take`.
    log: Mutex<Vec<String>>,
    /// The driver-measured durations (send to parsed reply) of those commands, summed.
    in_commands: Mutex<Duration>,
    /// Whether holder inserts are attributed to their `holderRef`.
    tracking: AtomicBool,
    /// `holderRef` → holder inserts: one per pass through the funnel, so more than one means the acquisition
    /// found a level full and waited.
    attempts: Mutex<HashMap<String, u32>>,
    /// `<collection>.<command>` → how many were sent while tracking.
    tally: Mutex<BTreeMap<String, u64>>,
}

impl Monitor {
    fn on_event(&self, event: CommandEvent) {
        let started = match event {
            CommandEvent::Started(started) => started,
            CommandEvent::Succeeded(e) => return self.finished(&e.command_name, e.duration),
            CommandEvent::Failed(e) => return self.finished(&e.command_name, e.duration),
            _ => return,
        };
        if IGNORED_COMMANDS.iter().any(|c| started.command_name.eq_ignore_ascii_case(c)) {
            return;
        }
        // The first field of a command names its collection (`{update: "<collection>", ...}`).
        let collection = started.command.iter().next().and_then(|(_, v)| v.as_str()).unwrap_or("-");
        let short = match collection {
            HOLDERS => "holders",
            COUNTERS => "counters",
            other => other,
        };
        // An update's flavour: `update` (one document), `upsert`, `update-many`.
        let first_update = started.command.get_array("updates").ok().and_then(|u| u.first()?.as_document());
        let name = match first_update {
            Some(u) if u.get_bool("upsert").unwrap_or(false) => "upsert",
            Some(u) if u.get_bool("multi").unwrap_or(false) => "update-many",
            _ => started.command_name.as_str(),
        };
        let label = format!("{short}.{name}");
        if self.tracking.load(Ordering::Relaxed) {
            *self.tally.lock().expect("tally lock").entry(label.clone()).or_default() += 1;
        }
        if self.tracking.load(Ordering::Relaxed) && started.command_name == "update" && collection == HOLDERS {
            let refs = holder_inserts(&started.command);
            if !refs.is_empty() {
                let mut attempts = self.attempts.lock().expect("attempts lock");
                for r in refs {
                    *attempts.entry(r).or_default() += 1;
                }
            }
        }
        if self.recording.load(Ordering::Relaxed) {
            self.log.lock().expect("log lock").push(label);
        }
    }

    fn finished(&self, command_name: &str, duration: Duration) {
        if self.recording.load(Ordering::Relaxed)
            && !IGNORED_COMMANDS.iter().any(|c| command_name.eq_ignore_ascii_case(c))
        {
            *self.in_commands.lock().expect("duration lock") += duration;
        }
    }

    /// The commands logged since the last call, and the time spent in them.
    fn take(&self) -> (Vec<String>, Duration) {
        let log = std::mem::take(&mut *self.log.lock().expect("log lock"));
        (log, std::mem::take(&mut *self.in_commands.lock().expect("duration lock")))
    }
}

/// The `holderRef`s of the upserts in an `update` command on the holders collection (the holder insert of a pass
/// through the funnel is an upsert with `$setOnInsert`).
fn holder_inserts(command: &Document) -> Vec<String> {
    let Ok(updates) = command.get_array("updates") else { return Vec::new() };
    updates
        .iter()
        .filter_map(|u| u.as_document())
        .filter(|u| u.get_bool("upsert").unwrap_or(false))
        .filter_map(|u| u.get_document("u").ok()?.get_document("$setOnInsert").ok()?.get_str("holderRef").ok())
        .map(str::to_owned)
        .collect()
}

/// A client of its own (a "pod"), optionally with a command monitor.
async fn client(uri: &str, name: &str, monitor: Option<Arc<Monitor>>) -> BenchResult<Client> {
    let mut options = ClientOptions::parse(uri).await?;
    options.server_selection_timeout.get_or_insert(Duration::from_secs(5));
    options.app_name = Some(format!("lease-bench-{name}"));
    if let Some(m) = monitor {
        options.command_event_handler = Some(EventHandler::callback(move |e| m.on_event(e)));
    }
    Ok(Client::with_options(options)?)
}

fn service(client: &Client, db: &str, defs: &[LeaseDefinition]) -> ResourceLeaseService {
    ResourceLeaseService::new(
        Arc::new(MongoStore::new(&client.database(db))),
        Arc::new(StaticDefinitions::new(defs.to_vec())),
        Arc::new(HashSet::from([TYPE.to_owned()])),
        None,
    )
}

fn request(lease: &str, holder_ref: String, pod: &str) -> LeaseRequest {
    LeaseRequest::new(TYPE, LeaseRef::Name(lease.into()), "t1", "p1").user("u1").holder_ref(holder_ref).pod(pod, false)
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The 1/5/15-minute load averages: other work on the machine skews every figure.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// CPU time of the whole machine, of this process and of the (local) mongod, in clock ticks: what other processes
/// took during a phase shows how far the figures of that phase were skewed by them.
#[derive(Debug, Clone, Copy)]
struct CpuSnapshot {
    busy: u64,
    total: u64,
    ours: u64,
}

/// `utime + stime` of a process, in clock ticks.
fn process_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after "(comm) ": state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

impl CpuSnapshot {
    fn take(mongod_pid: Option<i64>) -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is part of user).
        let total: u64 = cpu.iter().take(8).sum();
        let idle = cpu.get(3).copied().unwrap_or(0) + cpu.get(4).copied().unwrap_or(0);
        let mongod = mongod_pid.and_then(|p| process_ticks(&p.to_string())).unwrap_or(0);
        Some(CpuSnapshot { busy: total - idle, total, ours: process_ticks("self")? + mongod })
    }

    /// The share of all CPUs used since `self` by neither this process nor the mongod.
    fn others_since(self, mongod_pid: Option<i64>) -> String {
        match CpuSnapshot::take(mongod_pid) {
            Some(now) if now.total > self.total => {
                let others = now.busy.saturating_sub(self.busy).saturating_sub(now.ours.saturating_sub(self.ours));
                format!("CPU used outside bench+mongod {:.0}%", 100.0 * others as f64 / (now.total - self.total) as f64)
            }
            _ => "CPU used outside bench+mongod unknown".to_owned(),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn met(ok: bool) -> &'static str {
    if ok { "MET" } else { "NOT MET" }
}

/// p50 and p99 of unsorted samples.
fn p50_p99(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort_unstable();
    (pct(&samples, 0.50), pct(&samples, 0.99))
}

async fn bench(uri: &str) -> BenchResult<()> {
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let db_name = format!("lease_bench_{}_{stamp}", std::process::id());
    let admin = client(uri, "admin", None).await?;
    let db = admin.database(&db_name);
    let result = run(uri, &admin, &db).await;
    let dropped = db.drop().await;
    result?;
    dropped?;
    println!("database {db_name} dropped");
    Ok(())
}

async fn run(uri: &str, admin: &Client, db: &Database) -> BenchResult<()> {
    let defs = [DEF_3_LEVELS, DEF_HOT_64, DEF_HOT_8]
        .into_iter()
        .map(|(name, yaml)| LeaseDefinition::from_yaml(name, yaml))
        .collect::<Result<Vec<_>, _>>()?;
    let name = db.name().to_owned();

    // 5. The machine (printed first, so the table reads top-down).
    let build = admin.database("admin").run_command(doc! { "buildInfo": 1 }).await?;
    let mongod_version = build.get_str("version").unwrap_or("?").to_owned();
    // The mongod's pid, if it runs on this machine, to tell its CPU use from other processes'.
    let status = admin.database("admin").run_command(doc! { "serverStatus": 1 }).await?;
    let mongod_pid = status
        .get_i64("pid")
        .ok()
        .or_else(|| status.get_i32("pid").ok().map(i64::from))
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.contains("mongod")));
    let cpu = || CpuSnapshot::take(mongod_pid);
    let others = |since: Option<CpuSnapshot>| {
        since.map_or_else(|| "CPU used outside bench+mongod unknown".to_owned(), |s| s.others_since(mongod_pid))
    };
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let hosts = ClientOptions::parse(uri).await?.hosts.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    println!();
    println!("lease-bench — database {name}");
    println!("machine: nproc {nproc} · {cpu_model} · mongod {mongod_version} at {hosts} (single node, same host)");
    println!("load average at start: {}", loadavg());
    println!();

    // Clients: plain ones for every timing, monitored ones for counting.
    let mut plain = Vec::new();
    for i in 0..PODS {
        plain.push(client(uri, &format!("pod{i}"), None).await?);
    }
    let monitor = Arc::new(Monitor::default());
    let counted_client = client(uri, "counted", Some(monitor.clone())).await?;
    MongoStore::new(db).ensure_indexes().await?;

    let raw: Collection<Document> = plain[0].database(&name).collection("bench_raw");
    raw.insert_one(doc! { "_id": "rt", "count": 0_i64 }).await?;
    raw.insert_one(doc! { "_id": "hot", "count": 0_i64 }).await?;

    // 1. The raw round trip.
    let mut raw_samples = Vec::with_capacity(RAW_OPS);
    let cpu1 = cpu();
    for i in 0..WARMUP_OPS + RAW_OPS {
        let t = Instant::now();
        raw.update_one(doc! { "_id": "rt" }, doc! { "$inc": { "count": 1_i64 } }).await?;
        if i >= WARMUP_OPS {
            raw_samples.push(t.elapsed());
        }
    }
    let (rt_p50, rt_p99) = p50_p99(raw_samples);
    let others1 = others(cpu1);

    // 2. Round trips per operation, counted (and, as a diagnosis, how much of the wall time the driver spent inside
    // those commands).
    let counted = service(&counted_client, &name, &defs);
    let counted_raw: Collection<Document> = counted_client.database(&name).collection("bench_raw");
    let mut counts: BTreeMap<String, Counted> = BTreeMap::new();
    let mut record = |key: String, wall: Duration, (log, in_commands): (Vec<String>, Duration)| {
        let entry = counts.entry(key).or_default();
        entry.round_trips.push(log.len());
        entry.wall.push(wall);
        entry.in_commands.push(in_commands);
        if entry.commands.is_empty() {
            entry.commands = log;
        }
    };
    monitor.recording.store(true, Ordering::SeqCst);
    for i in 0..WARMUP_OPS + COUNT_ITERS {
        monitor.take();
        let t = Instant::now();
        counted_raw.update_one(doc! { "_id": "rt" }, doc! { "$inc": { "count": 1_i64 } }).await?;
        let wall = t.elapsed();
        if i >= WARMUP_OPS {
            record("raw".to_owned(), wall, monitor.take());
        }
    }
    for (lease, tag) in [(DEF_3_LEVELS.0, "3"), (DEF_HOT_64.0, "1")] {
        for i in 0..WARMUP_OPS + COUNT_ITERS {
            monitor.take();
            let t0 = Instant::now();
            let l = counted.acquire(request(lease, format!("count{i}"), "pod-counted")).await?;
            let t1 = Instant::now();
            let acquire = monitor.take();
            l.check().await?;
            let t2 = Instant::now();
            let check = monitor.take();
            l.release().await?;
            let t3 = Instant::now();
            let release = monitor.take();
            if i >= WARMUP_OPS {
                record(format!("{tag}/acquire"), t1 - t0, acquire);
                record(format!("{tag}/check"), t2 - t1, check);
                record(format!("{tag}/release"), t3 - t2, release);
            }
        }
    }
    monitor.recording.store(false, Ordering::SeqCst);
    println!("[1] raw round trip: update_one {{_id}} $inc, {RAW_OPS} sequential ops after {WARMUP_OPS} warm-up");
    println!("    p50 {:.3} ms   p99 {:.3} ms   ({others1})", ms(rt_p50), ms(rt_p99));
    println!();
    println!(
        "[2] round trips per op, counted by a command monitor (CommandStarted; handshake/monitoring ignored), \
         {COUNT_ITERS} uncontended sequential iterations after {WARMUP_OPS} warm-up, counters pre-created; \
         monitored client: wall p50 and p50 of the time the driver spent inside the op's commands"
    );
    println!(
        "    {:<26} {:>7} {:>8} {:>9} {:>9}  commands",
        "definition / op", "counted", "expected", "wall p50", "in cmds"
    );
    let expected = [
        ("raw", 1),
        ("3/acquire", 7),
        ("3/check", 1),
        ("3/release", 2),
        ("1/acquire", 3),
        ("1/check", 1),
        ("1/release", 2),
    ];
    for (key, exp) in expected {
        let c = &counts[key];
        let label = match key.split_once('/') {
            Some(("3", op)) => format!("3 levels (bench) {op}"),
            Some((_, op)) => format!("1 level (hot64)  {op}"),
            None => "raw update_one $inc".to_owned(),
        };
        let flag = if c.min() == exp && c.max() == exp { "" } else { "  <-- differs" };
        println!(
            "    {label:<26} {:>7} {exp:>8} {:>9.3} {:>9.3}  {}{flag}",
            c.shown(),
            ms(p50_p99(c.wall.clone()).0),
            ms(p50_p99(c.in_commands.clone()).0),
            c.breakdown()
        );
    }
    let acquire_rts = counts["3/acquire"].max();
    let pair_rts = counts["1/acquire"].max() + counts["1/release"].max();
    println!();

    // 3. Latency, uncontended, sequential, 3 levels.
    let timed = service(&plain[0], &name, &defs);
    let cpu3 = cpu();
    let (mut acq, mut chk, mut rel, mut control) = (
        Vec::with_capacity(LATENCY_ITERS),
        Vec::with_capacity(LATENCY_ITERS),
        Vec::with_capacity(LATENCY_ITERS),
        Vec::with_capacity(LATENCY_ITERS),
    );
    for i in 0..WARMUP_OPS + LATENCY_ITERS {
        // A control: the raw round trip, interleaved, so that drift of the machine shows.
        let t = Instant::now();
        raw.update_one(doc! { "_id": "rt" }, doc! { "$inc": { "count": 1_i64 } }).await?;
        if i >= WARMUP_OPS {
            control.push(t.elapsed());
        }
        let t0 = Instant::now();
        let l = timed.acquire(request(DEF_3_LEVELS.0, format!("lat{i}"), "pod0")).await?;
        let t1 = Instant::now();
        l.check().await?;
        let t2 = Instant::now();
        l.release().await?;
        let t3 = Instant::now();
        if i >= WARMUP_OPS {
            acq.push(t1 - t0);
            chk.push(t2 - t1);
            rel.push(t3 - t2);
        }
    }
    println!(
        "[3] latency, uncontended, sequential, 3-level definition, {LATENCY_ITERS} iterations after {WARMUP_OPS} \
         warm-up ({})",
        others(cpu3)
    );
    println!("    {:<8} {:>9} {:>9} {:>12} {:>12}", "op", "p50 ms", "p99 ms", "p50 / RT p50", "round trips");
    let mut acquire_p50 = Duration::ZERO;
    for (op, samples, key) in [("acquire", acq, "3/acquire"), ("check", chk, "3/check"), ("release", rel, "3/release")]
    {
        let (p50, p99) = p50_p99(samples);
        if op == "acquire" {
            acquire_p50 = p50;
        }
        let ratio = p50.as_secs_f64() / rt_p50.as_secs_f64();
        println!("    {op:<8} {:>9.3} {:>9.3} {ratio:>12.2} {:>12}", ms(p50), ms(p99), counts[key].shown());
    }
    let budget = rt_p50.mul_f64(LATENCY_SLACK * acquire_rts as f64);
    println!(
        "    target: acquire p50 ≤ {LATENCY_SLACK} × ({acquire_rts} × RT p50) = {:.3} ms (ratio ≤ {:.2}): acquire p50 \
         {:.3} ms (ratio {:.2}) → {}",
        ms(budget),
        LATENCY_SLACK * acquire_rts as f64,
        ms(acquire_p50),
        acquire_p50.as_secs_f64() / rt_p50.as_secs_f64(),
        met(acquire_p50 <= budget)
    );
    let (control_p50, _) = p50_p99(control);
    println!(
        "    control: the raw round trip interleaved with this loop: p50 {:.3} ms (acquire p50 / it = {:.2} → {})",
        ms(control_p50),
        acquire_p50.as_secs_f64() / control_p50.as_secs_f64(),
        met(acquire_p50 <= control_p50.mul_f64(LATENCY_SLACK * acquire_rts as f64))
    );
    let primitives = primitives(&plain[0], &name).await?;
    println!("    where the time goes: the store primitives alone (MongoStore, 1000 sequential rounds), p50 ms:");
    println!("      {}", primitives.iter().map(|(n, d)| format!("{n} {:.3}", ms(*d))).collect::<Vec<_>>().join(" · "));
    let p = |n: &str| primitives.iter().find(|(k, _)| *k == n).map_or(Duration::ZERO, |(_, d)| *d);
    let levels = (acquire_rts.saturating_sub(1) / 2) as u32;
    // The funnel's critical path: each push overlaps the next level's increment.
    let overlapped = p("try_increment").max(p("push_level")) * levels.saturating_sub(1);
    let acquire_path = p("insert_holder") + p("try_increment") + overlapped + p("push_level");
    println!(
        "      acquire as primitives on its critical path: insert_holder + try_increment + {} × max(push_level, \
         try_increment) + push_level = {:.3} ms (all {} calls in sequence: {:.3} ms); acquire p50 {:.3} ms; the \
         service and the overlap add {:.3} ms",
        levels.saturating_sub(1),
        ms(acquire_path),
        acquire_rts,
        ms(p("insert_holder") + (p("try_increment") + p("push_level")) * levels),
        ms(acquire_p50),
        acquire_p50.as_secs_f64() * 1e3 - ms(acquire_path)
    );
    println!();

    // 4. Throughput under contention.
    let hot: Vec<Collection<Document>> = plain.iter().map(|c| c.database(&name).collection("bench_raw")).collect();
    let cpu_raw = cpu();
    let raw_run = hammer(hot, |coll: Collection<Document>, _task, _i| async move {
        let r = coll
            .update_one(doc! { "_id": "hot", "count": { "$lt": HUGE } }, doc! { "$inc": { "count": 1_i64 } })
            .await?;
        if r.matched_count != 1 {
            return Err("the raw conditional update matched nothing".into());
        }
        Ok(())
    })
    .await?
    .0;
    let raw_rate = raw_run.len() as f64 / CONTENTION_WINDOW.as_secs_f64();
    let others_raw = others(cpu_raw);

    let pods: Vec<(ResourceLeaseService, String)> =
        plain.iter().enumerate().map(|(i, c)| (service(c, &name, &defs), format!("pod{i}"))).collect();
    let cpu64 = cpu();
    let run64 =
        hammer(pods, |(svc, pod): (ResourceLeaseService, String), task, i| pair(svc, pod, DEF_HOT_64.0, task, i))
            .await?
            .0;
    let others64 = others(cpu64);
    let pairs64 = run64.iter().filter(|p| p.busy.is_none()).count();
    let busy64 = run64.len() - pairs64;
    let pair_rate = pairs64 as f64 / CONTENTION_WINDOW.as_secs_f64();
    let efficiency = pair_rate / (raw_rate / pair_rts as f64);
    let (a64_p50, a64_p99) = p50_p99(run64.iter().filter(|p| p.busy.is_none()).map(|p| p.acquire).collect());

    // Cap 8: monitored clients, so that each acquisition's passes through the funnel can be counted.
    let tracker = Arc::new(Monitor::default());
    let mut pods8 = Vec::new();
    for i in 0..PODS {
        let c = client(uri, &format!("pod{i}-tracked"), Some(tracker.clone())).await?;
        pods8.push((service(&c, &name, &defs), format!("pod{i}")));
    }
    tracker.tracking.store(true, Ordering::SeqCst);
    let cpu8 = cpu();
    let (run8, total8) =
        hammer(pods8, |(svc, pod): (ResourceLeaseService, String), task, i| pair(svc, pod, DEF_HOT_8.0, task, i))
            .await?;
    let others8 = others(cpu8);
    let tally = std::mem::take(&mut *tracker.tally.lock().expect("tally lock"));
    tracker.tracking.store(false, Ordering::SeqCst);
    let attempts = std::mem::take(&mut *tracker.attempts.lock().expect("attempts lock"));
    let pairs8 = run8.iter().filter(|p| p.busy.is_none()).count();
    let busy8 = run8.len() - pairs8;
    let passes: Vec<u32> = run8.iter().map(|p| attempts.get(&p.holder_ref).copied().unwrap_or(0)).collect();
    let untracked = passes.iter().filter(|&&n| n == 0).count();
    let waited = passes.iter().filter(|&&n| n > 1).count();
    let retries: u32 = passes.iter().map(|&n| n.saturating_sub(1)).sum();
    let max_passes = passes.iter().copied().max().unwrap_or(0);
    let (a8_p50, a8_p99) = p50_p99(run8.iter().filter(|p| p.busy.is_none()).map(|p| p.acquire).collect());

    println!(
        "[4] contention: {TASKS} tasks over {PODS} services (one client each), {}s window after {}s ramp-up, one \
         hot document",
        CONTENTION_WINDOW.as_secs(),
        CONTENTION_WARMUP.as_secs()
    );
    println!("    {:<44} {:>10}  notes", "workload", "rate/s");
    println!("    {:<44} {:>10.0}  ops/s; {others_raw}", "raw update_one {_id, count<huge} $inc", raw_rate);
    println!(
        "    {:<44} {:>10.0}  pairs/s; acquire p50 {:.2} ms p99 {:.2} ms; busy {busy64}; {others64}",
        "lease acquire+release, 1 level, cap 64",
        pair_rate,
        ms(a64_p50),
        ms(a64_p99)
    );
    println!(
        "    efficiency = {pair_rate:.0} ÷ ({raw_rate:.0} ÷ {pair_rts} round trips per pair) = {efficiency:.2}; target ≥ \
         {EFFICIENCY_TARGET} → {}",
        met(efficiency >= EFFICIENCY_TARGET)
    );
    println!(
        "    {:<44} {:>10.0}  pairs/s; acquire p50 {:.2} ms p99 {:.2} ms; busy {busy8}; {others8}",
        "lease acquire+release, 1 level, cap 8 (*)",
        pairs8 as f64 / CONTENTION_WINDOW.as_secs_f64(),
        ms(a8_p50),
        ms(a8_p99)
    );
    println!(
        "    (*) waitMs 600000, monitored clients: {} acquisitions in the window, {waited} waited ({:.0}%), {retries} \
         retries (extra passes through the funnel), at most {max_passes} passes for one acquisition{}",
        run8.len(),
        100.0 * waited as f64 / run8.len().max(1) as f64,
        if untracked > 0 { format!(", {untracked} not seen by the monitor") } else { String::new() }
    );
    let per_pair = |n: u64| n as f64 / total8.max(1) as f64;
    println!(
        "    (*) round trips per pair over the whole run ({total8} pairs): {:.1} = {}",
        per_pair(tally.values().sum()),
        tally.iter().map(|(c, n)| format!("{c} {:.2}", per_pair(*n))).collect::<Vec<_>>().join(" + ")
    );
    println!();

    // The funnel must leave nothing behind: every counter back at 0, no holder.
    let store = MongoStore::new(db);
    let leftover_counters: Vec<_> = store.counters(None).await?.into_iter().filter(|c| c.count != 0).collect();
    let leftover_holders = store.holders(None).await?.len();
    if leftover_counters.is_empty() && leftover_holders == 0 {
        println!("consistency: every counter back at 0, no holder left");
    } else {
        println!("consistency: NOT CLEAN: counters ≠ 0: {leftover_counters:?}; holders left: {leftover_holders}");
    }
    println!("load average at end: {}", loadavg());
    Ok(())
}

/// p50 of each store primitive of the funnel, called directly on a [`MongoStore`] one after another as a 1-level
/// acquire / check / release would (fresh holder each round, one existing counter).
async fn primitives(client: &Client, db: &str) -> BenchResult<Vec<(&'static str, Duration)>> {
    let store = MongoStore::new(&client.database(db));
    let key = CounterKey::for_level("primitives", Level::Global, "t1", "p1", None).ok_or("no counter key")?;
    store.ensure_counter(&key).await?;
    let id = key.id();
    let names = ["insert_holder", "try_increment", "push_level", "touch", "delete_holder", "decrement"];
    let mut samples: Vec<Vec<Duration>> = names.iter().map(|_| Vec::with_capacity(LATENCY_ITERS)).collect();
    for i in 0..WARMUP_OPS + LATENCY_ITERS {
        let token = format!("primitive-{i}");
        let holder = NewHolder {
            token: token.clone(),
            lease_type: TYPE.to_owned(),
            lease: "primitives".to_owned(),
            resource: "primitives".to_owned(),
            tenant_id: "t1".to_owned(),
            project_id: "p1".to_owned(),
            user_id: Some("u1".to_owned()),
            holder_ref: format!("h{i}"),
            pod: "pod0".to_owned(),
            pod_bound: false,
            payload: Payload::new(),
            ttl_seconds: 60,
        };
        let mut times = [Duration::ZERO; 6];
        let t = Instant::now();
        store.insert_holder(&holder).await?;
        times[0] = t.elapsed();
        let t = Instant::now();
        if !store.try_increment(&key, 1_000_000).await? {
            return Err("try_increment refused".into());
        }
        times[1] = t.elapsed();
        let t = Instant::now();
        store.push_level(&token, &id, true).await?;
        times[2] = t.elapsed();
        let t = Instant::now();
        store.touch(&token, None).await?;
        times[3] = t.elapsed();
        let t = Instant::now();
        let deleted = store.delete_holder(&token, DeleteCondition::Any).await?.ok_or("holder vanished")?;
        times[4] = t.elapsed();
        let t = Instant::now();
        store.decrement(&deleted.levels).await?;
        times[5] = t.elapsed();
        if i >= WARMUP_OPS {
            for (s, t) in samples.iter_mut().zip(times) {
                s.push(t);
            }
        }
    }
    Ok(names.into_iter().zip(samples).map(|(n, s)| (n, p50_p99(s).0)).collect())
}

/// The counted round trips of one operation.
#[derive(Debug, Default)]
struct Counted {
    /// Commands per call.
    round_trips: Vec<usize>,
    /// The commands of the first call.
    commands: Vec<String>,
    /// Wall time per call.
    wall: Vec<Duration>,
    /// Driver-measured time inside the commands, per call.
    in_commands: Vec<Duration>,
}

impl Counted {
    fn min(&self) -> usize {
        self.round_trips.iter().copied().min().unwrap_or(0)
    }

    fn max(&self) -> usize {
        self.round_trips.iter().copied().max().unwrap_or(0)
    }

    /// `7`, or `6–8` when the calls differed.
    fn shown(&self) -> String {
        if self.min() == self.max() { self.min().to_string() } else { format!("{}–{}", self.min(), self.max()) }
    }

    /// `counters.update×3 + holders.update×4`.
    fn breakdown(&self) -> String {
        let mut by_command: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &self.commands {
            *by_command.entry(c.as_str()).or_default() += 1;
        }
        by_command.iter().map(|(c, n)| format!("{c}×{n}")).collect::<Vec<_>>().join(" + ")
    }
}

/// One acquire + release of a contention run.
#[derive(Debug)]
struct Pair {
    holder_ref: String,
    acquire: Duration,
    /// `Some` when the acquisition gave up with `LEASE_BUSY`.
    busy: Option<LeaseError>,
}

async fn pair(svc: ResourceLeaseService, pod: String, lease: &str, task: usize, i: u64) -> BenchResult<Pair> {
    let holder_ref = format!("{pod}-t{task}-{i}");
    let t = Instant::now();
    match svc.acquire(request(lease, holder_ref.clone(), &pod)).await {
        Ok(l) => {
            let acquire = t.elapsed();
            l.release().await?;
            Ok(Pair { holder_ref, acquire, busy: None })
        }
        Err(e @ LeaseError::Busy(_)) => Ok(Pair { holder_ref, acquire: t.elapsed(), busy: Some(e) }),
        Err(e) => Err(e.into()),
    }
}

/// Runs `op` in a loop on `TASKS` tasks (task `k` on `targets[k % targets.len()]`) for the ramp-up plus the window;
/// returns the outputs of the operations that completed inside the window, and how many completed in the whole run.
/// No task starts an operation after the window; one in flight at its end finishes uncounted.
async fn hammer<T, F, Fut, O>(targets: Vec<T>, op: F) -> BenchResult<(Vec<O>, u64)>
where
    T: Clone + Send + Sync + 'static,
    F: Fn(T, usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = BenchResult<O>> + Send + 'static,
    O: Send + 'static,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let from = start + CONTENTION_WARMUP;
    let until = from + CONTENTION_WINDOW;
    let mut handles = Vec::with_capacity(TASKS);
    for task in 0..TASKS {
        let target = targets[task % targets.len()].clone();
        let op = op.clone();
        handles.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut i: u64 = 0;
            while Instant::now() < until {
                let out = op(target.clone(), task, i).await?;
                i += 1;
                let end = Instant::now();
                if end >= from && end < until {
                    done.push(out);
                }
            }
            Ok::<_, Box<dyn Error + Send + Sync>>((done, i))
        }));
    }
    let (mut all, mut total) = (Vec::new(), 0);
    for h in handles {
        let (done, n) = h.await??;
        all.extend(done);
        total += n;
    }
    Ok((all, total))
}
