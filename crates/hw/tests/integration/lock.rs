//! The per-slice hardware lock: exclusion, FIFO order, try/timeout, and the
//! wait / hold / busy accounting.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::sync::Arc;
use std::time::Duration;

use mtswarm_hw::lock::{HwLock, LockError};
use tokio::sync::{mpsc, oneshot};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn waiters_are_served_in_arrival_order() {
    let lock = HwLock::new();
    let first = lock.acquire("b0/c0").await;
    let (order_tx, mut order_rx) = mpsc::channel::<usize>(16);
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let task_lock = lock.clone();
        let order_tx = order_tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = task_lock.acquire("b0/c0").await;
            order_tx.send(i).await.expect("send order");
            drop(guard);
        }));
        // Wait until waiter i is queued before starting the next one.
        tokio::time::timeout(WAIT, async {
            while lock.stats("b0/c0").map(|s| s.waiting).unwrap_or(0) < i as u64 + 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("waiter queued");
    }
    drop(order_tx);
    drop(first);
    let mut order = Vec::new();
    while let Some(i) = tokio::time::timeout(WAIT, order_rx.recv())
        .await
        .expect("order")
    {
        order.push(i);
    }
    assert_eq!(order, [0, 1, 2, 3, 4]);
    for t in tasks {
        t.await.expect("task");
    }
    let stats = lock.stats("b0/c0").expect("stats");
    assert_eq!(stats.acquisitions, 6);
    assert_eq!(stats.waiting, 0);
    assert!(!stats.held);
}

#[tokio::test]
async fn holders_never_overlap() {
    let lock = HwLock::new();
    let inside = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let max_inside = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (lock, inside, max_inside) = (lock.clone(), inside.clone(), max_inside.clone());
        tasks.push(tokio::spawn(async move {
            let _g = lock.acquire("s").await;
            let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            max_inside.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
            tokio::task::yield_now().await;
            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(max_inside.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Different slices are independent.
    let _a = lock.try_acquire("a").expect("a free");
    let _b = lock.try_acquire("b").expect("b free");
}

#[tokio::test]
async fn try_acquire_and_timeout_report_busy() {
    let lock = HwLock::new();
    let guard = lock.try_acquire("s").expect("free slice");
    assert_eq!(guard.waited(), Duration::ZERO);
    assert!(matches!(lock.try_acquire("s"), Err(LockError::Busy { .. })));
    let err = lock
        .acquire_timeout("s", Duration::from_millis(20))
        .await
        .expect_err("held slice times out");
    assert!(matches!(err, LockError::Timeout { .. }));
    assert!(err.to_string().contains("still busy"));
    // The timed-out waiter left the queue.
    assert_eq!(lock.stats("s").expect("stats").waiting, 0);
    drop(guard);
    let again = lock
        .acquire_timeout("s", Duration::from_secs(5))
        .await
        .expect("free again");
    drop(again);
}

#[tokio::test]
async fn try_acquire_does_not_overtake_a_queued_waiter() {
    let lock = HwLock::new();
    let holder = lock.acquire("s").await;
    let (got_tx, got_rx) = oneshot::channel::<()>();
    let queued = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let g = lock.acquire("s").await;
            let _ = got_tx.send(());
            // Hold until the test is done checking.
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(g);
        })
    };
    tokio::time::timeout(WAIT, async {
        while lock.stats("s").map(|s| s.waiting).unwrap_or(0) < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("queued");
    drop(holder);
    // The permit went to the queued waiter, not to us.
    assert!(lock.try_acquire("s").is_err());
    tokio::time::timeout(WAIT, got_rx)
        .await
        .expect("served")
        .expect("sent");
    queued.await.expect("task");
}

#[tokio::test]
async fn wait_hold_and_busy_time_are_accounted() {
    let lock = HwLock::new();
    let hold = Duration::from_millis(60);
    let guard = lock.acquire("s").await;
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let g = lock.acquire("s").await;
            g.waited()
        })
    };
    tokio::time::timeout(WAIT, async {
        while lock.stats("s").map(|s| s.waiting).unwrap_or(0) < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("queued");
    tokio::time::sleep(hold).await;
    let during = lock.stats("s").expect("stats");
    assert!(during.held);
    assert!(
        during.busy >= hold,
        "current hold counts as busy: {during:?}"
    );
    drop(guard);
    let waited = tokio::time::timeout(WAIT, waiter)
        .await
        .expect("served")
        .expect("task");
    assert!(
        waited >= hold,
        "waiter queued for the whole hold: {waited:?}"
    );

    let stats = lock.stats("s").expect("stats");
    assert_eq!(stats.acquisitions, 2);
    assert!(stats.total_wait >= hold);
    assert_eq!(stats.max_wait, stats.last_wait);
    assert!(stats.max_hold >= hold);
    assert!(stats.busy >= hold && stats.busy <= stats.elapsed);
    let u = stats.utilization();
    assert!(u > 0.0 && u <= 1.0, "utilization {u}");
    assert!(stats.mean_wait() >= hold / 2);
    assert_eq!(lock.all_stats().len(), 1);
    assert!(lock.stats("never-used").is_none());
}
