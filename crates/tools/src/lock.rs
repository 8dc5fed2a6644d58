//! The slice lock the engine takes around hardware calls: `mtswarm-hw`'s
//! fair, accounted [`HwLock`] behind `mtswarm-core`'s [`ResourceLock`] trait
//! (neither crate may know the other, so the adapter lives here).

use mtswarm_core::{ResourceGuard, ResourceLock};
use mtswarm_hw::lock::HwLock;

/// [`HwLock`] as the engine's resource lock; resources are slice ids.
#[derive(Debug, Clone, Default)]
pub struct HwResourceLock {
    lock: HwLock,
}

impl HwResourceLock {
    pub fn new(lock: HwLock) -> Self {
        Self { lock }
    }

    /// The underlying lock (for statistics).
    pub fn hw_lock(&self) -> &HwLock {
        &self.lock
    }
}

#[async_trait::async_trait]
impl ResourceLock for HwResourceLock {
    async fn acquire(&self, resource: &str) -> ResourceGuard {
        let guard = self.lock.acquire(resource).await;
        ResourceGuard::new(guard.waited(), guard)
    }
}
