//! The metrics read when a reader collects rather than recorded as things
//! happen: how many jobs a leader runs and queues, how many sessions a
//! worker holds, and the slices' lock accounting (which the hardware lock
//! keeps anyway). The daemon hands a callback over its own state; it should
//! hold that state weakly and return `None` once the daemon is gone.

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, ObservableCounter, ObservableGauge};

use super::METER_NAME;
use super::catalog::{self, ATTR_SLICE, ATTR_STATE, ATTR_WORKER, InstrumentDef};

/// A leader's jobs right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobCounts {
    /// Jobs whose leader loop runs.
    pub running: u64,
    /// Jobs waiting for a free place.
    pub queued: u64,
}

/// One slice's hardware lock accounting, cumulative since the daemon started.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceLockReading {
    /// The slice's bus id.
    pub slice: String,
    /// Seconds the lock was held, including a hold under way.
    pub busy_seconds: f64,
    /// Seconds callers queued for it, summed.
    pub wait_seconds: f64,
    /// Holds granted.
    pub acquisitions: u64,
}

/// Keeps a leader's observed instruments; dropping it changes nothing
/// (the callbacks live as long as the meter provider), but it names what
/// was registered.
#[derive(Debug)]
pub struct LeaderObservers {
    _jobs: ObservableGauge<u64>,
}

/// Keeps a worker's observed instruments (see [`LeaderObservers`]).
#[derive(Debug)]
pub struct WorkerObservers {
    _sessions: ObservableGauge<u64>,
    _busy: ObservableCounter<f64>,
    _wait: ObservableCounter<f64>,
    _acquisitions: ObservableCounter<u64>,
}

fn meter() -> Meter {
    opentelemetry::global::meter(METER_NAME)
}

/// Observes `mtswarm.jobs` by state from `source`.
pub fn observe_jobs(
    source: impl Fn() -> Option<JobCounts> + Send + Sync + 'static,
) -> LeaderObservers {
    let def = &catalog::JOBS;
    let jobs = meter()
        .u64_observable_gauge(def.name)
        .with_unit(def.unit)
        .with_description(def.description)
        .with_callback(move |observer| {
            if let Some(counts) = source() {
                observer.observe(counts.running, &[KeyValue::new(ATTR_STATE, "running")]);
                observer.observe(counts.queued, &[KeyValue::new(ATTR_STATE, "queued")]);
            }
        })
        .build();
    LeaderObservers { _jobs: jobs }
}

fn lock_counter(
    def: &'static InstrumentDef,
    worker: &str,
    locks: std::sync::Arc<dyn Fn() -> Option<Vec<SliceLockReading>> + Send + Sync>,
    value: fn(&SliceLockReading) -> f64,
) -> ObservableCounter<f64> {
    let worker = worker.to_string();
    meter()
        .f64_observable_counter(def.name)
        .with_unit(def.unit)
        .with_description(def.description)
        .with_callback(move |observer| {
            for reading in locks().unwrap_or_default() {
                observer.observe(
                    value(&reading),
                    &[
                        KeyValue::new(ATTR_WORKER, worker.clone()),
                        KeyValue::new(ATTR_SLICE, reading.slice.clone()),
                    ],
                );
            }
        })
        .build()
}

/// Observes a worker daemon's `mtswarm.worker.sessions` from `sessions`
/// and its slices' `mtswarm.slice.lock.*` from `locks`.
pub fn observe_worker(
    worker: &str,
    sessions: impl Fn() -> Option<u64> + Send + Sync + 'static,
    locks: impl Fn() -> Option<Vec<SliceLockReading>> + Send + Sync + 'static,
) -> WorkerObservers {
    let locks: std::sync::Arc<dyn Fn() -> Option<Vec<SliceLockReading>> + Send + Sync> =
        std::sync::Arc::new(locks);
    let def = &catalog::WORKER_SESSIONS;
    let worker_id = worker.to_string();
    let sessions = meter()
        .u64_observable_gauge(def.name)
        .with_unit(def.unit)
        .with_description(def.description)
        .with_callback(move |observer| {
            if let Some(count) = sessions() {
                observer.observe(count, &[KeyValue::new(ATTR_WORKER, worker_id.clone())]);
            }
        })
        .build();
    let acquisitions = {
        let def = &catalog::SLICE_LOCK_ACQUISITIONS;
        let worker = worker.to_string();
        let locks = locks.clone();
        meter()
            .u64_observable_counter(def.name)
            .with_unit(def.unit)
            .with_description(def.description)
            .with_callback(move |observer| {
                for reading in locks().unwrap_or_default() {
                    observer.observe(
                        reading.acquisitions,
                        &[
                            KeyValue::new(ATTR_WORKER, worker.clone()),
                            KeyValue::new(ATTR_SLICE, reading.slice.clone()),
                        ],
                    );
                }
            })
            .build()
    };
    WorkerObservers {
        _sessions: sessions,
        _busy: lock_counter(&catalog::SLICE_LOCK_BUSY, worker, locks.clone(), |r| {
            r.busy_seconds
        }),
        _wait: lock_counter(&catalog::SLICE_LOCK_WAIT, worker, locks, |r| r.wait_seconds),
        _acquisitions: acquisitions,
    }
}
