//! The resource lock hardware tools take, as a trait so the engine stays free
//! of any particular hardware. The worker plugs in the per-slice hardware lock
//! of `mtswarm-hw`; tests and the leader use [`LocalResourceLock`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Held while a hardware call runs; dropping it releases the resource.
pub struct ResourceGuard {
    /// How long the caller queued before it got the resource.
    pub waited: Duration,
    _release: Box<dyn Send + Sync>,
}

impl ResourceGuard {
    /// Wrap whatever releases the resource on drop (a semaphore permit, a
    /// mutex guard, ...).
    pub fn new(waited: Duration, release: impl Send + Sync + 'static) -> Self {
        Self {
            waited,
            _release: Box::new(release),
        }
    }
}

impl std::fmt::Debug for ResourceGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceGuard")
            .field("waited", &self.waited)
            .finish_non_exhaustive()
    }
}

/// One holder at a time per named resource; waiters are served in order.
#[async_trait::async_trait]
pub trait ResourceLock: Send + Sync {
    /// Wait until `resource` is free and hold it until the guard drops.
    async fn acquire(&self, resource: &str) -> ResourceGuard;
}

/// An in-process FIFO lock per resource name (tokio's mutex is fair).
#[derive(Default, Clone)]
pub struct LocalResourceLock {
    locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

#[async_trait::async_trait]
impl ResourceLock for LocalResourceLock {
    async fn acquire(&self, resource: &str) -> ResourceGuard {
        let lock = {
            let mut map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(resource.to_owned()).or_default().clone()
        };
        let start = Instant::now();
        let guard = lock.lock_owned().await;
        ResourceGuard::new(start.elapsed(), guard)
    }
}
