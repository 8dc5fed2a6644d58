//! Bad data never stops the system: an undecodable KV value is skipped by
//! listings and watches (the rest still answer), and a stream or bucket
//! deleted while the system runs is re-created when an operation notices.
//! Real nats-server, one per test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::{bare_result, next_ok, setup, task, within};
use futures::StreamExt as _;
use mtswarm_bus::subjects;
use mtswarm_bus::{
    Jobs, KvChange, Quarantine, ResultConsumerConfig, TaskConsumerConfig, Workers, v1,
};

/// Bytes that no protobuf message decodes: field 1 with wire type 7
/// (reserved), i.e. not even a well-formed tag.
const JUNK: &[u8] = b"\x0f\xff\xff\xff\xff\xff";

async fn put_raw(bus: &mtswarm_bus::Bus, bucket: &str, key: &str, value: &'static [u8]) {
    bus.jetstream()
        .get_key_value(bucket)
        .await
        .expect("bucket")
        .put(key, value.into())
        .await
        .expect("raw put");
}

/// The ids of the jobs `jobs` lists.
async fn listed_ids(jobs: &Jobs, what: &str) -> Vec<String> {
    jobs.list()
        .await
        .expect(what)
        .into_iter()
        .map(|job| job.value.job_id)
        .collect()
}

fn job(id: &str) -> v1::JobRecord {
    v1::JobRecord {
        job_id: id.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn listings_skip_an_undecodable_value_and_return_the_rest() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    jobs.create(&job("good-1")).await.expect("create");
    put_raw(&bus, subjects::JOBS_BUCKET, "junk", JUNK).await;
    jobs.create(&job("good-2")).await.expect("create");

    let listed = listed_ids(&jobs, "the listing answers despite the junk value").await;
    assert_eq!(listed, ["good-1", "good-2"]);

    // Reading the junk key itself is a clear error naming it, not a panic.
    let error = jobs.get("junk").await.expect_err("junk is not a JobRecord");
    assert!(error.is_undecodable(), "{error}");
    assert!(error.to_string().contains("junk"), "{error}");

    // The same for the other buckets every listing RPC reads.
    put_raw(&bus, subjects::WORKERS_BUCKET, "w-junk", JUNK).await;
    let workers = Workers::open(&bus).await.expect("workers");
    assert!(workers.list().await.expect("workers listing").is_empty());
    put_raw(&bus, subjects::QUARANTINE_BUCKET, "s-junk", JUNK).await;
    let quarantine = Quarantine::open(&bus).await.expect("quarantine");
    assert!(
        quarantine
            .list()
            .await
            .expect("quarantine listing")
            .is_empty()
    );
}

#[tokio::test]
async fn watches_skip_an_undecodable_value_and_keep_going() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    put_raw(&bus, subjects::JOBS_BUCKET, "junk-before", JUNK).await;
    let mut current = jobs
        .kv()
        .watch_with_current()
        .await
        .expect("watch with current");
    let mut changes = jobs.watch().await.expect("watch");
    put_raw(&bus, subjects::JOBS_BUCKET, "junk-after", JUNK).await;
    jobs.create(&job("good")).await.expect("create");

    for (what, stream) in [("current", &mut current), ("live", &mut changes)] {
        let change = within(what, stream.next())
            .await
            .expect("the watch stays open")
            .expect("the junk values are skipped, not errors");
        match change {
            KvChange::Put { key, .. } => assert_eq!(key, "good", "{what}"),
            other => panic!("{what}: unexpected change {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_deleted_results_stream_is_recreated_by_the_next_consumer() {
    let (_server, bus) = setup().await;
    bus.jetstream()
        .delete_stream(subjects::RESULTS_STREAM)
        .await
        .expect("delete the results stream");

    // Publishing finds no stream and says so; the loss is noticed.
    let result = bare_result("t1");
    let error = bus
        .publish_result(&result)
        .await
        .expect_err("no stream stores results now");
    assert!(error.to_string().contains("mtswarm.result.job1"), "{error}");

    // A consumer on the lost stream re-creates it and then works.
    let consumer = within(
        "the result consumer",
        bus.result_consumer(ResultConsumerConfig::new("after-loss")),
    )
    .await
    .expect("the consumer re-creates its stream");
    bus.publish_result(&result)
        .await
        .expect("results are stored again");
    let mut messages = consumer.messages().await.expect("messages");
    let delivery = next_ok("the result", &mut messages).await;
    assert_eq!(delivery.message().task_id, "t1");

    // The task stream is handled the same way.
    bus.jetstream()
        .delete_stream(subjects::TASKS_STREAM)
        .await
        .expect("delete the tasks stream");
    within(
        "the task consumer",
        bus.task_consumer("w1", TaskConsumerConfig::default()),
    )
    .await
    .expect("the consumer re-creates its stream");
    bus.publish_task(&task("t2", 1, "w1", "s1"))
        .await
        .expect("tasks are stored again");
}

#[tokio::test]
async fn a_deleted_bucket_is_recreated_by_the_next_write() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    jobs.create(&job("before")).await.expect("create");
    bus.jetstream()
        .delete_key_value(subjects::JOBS_BUCKET)
        .await
        .expect("delete the jobs bucket");

    // The listing of a lost bucket is empty, not an error, and the next
    // write lands in the re-created bucket.
    assert!(jobs.list().await.expect("listing").is_empty());
    jobs.create(&job("after"))
        .await
        .expect("the write lands in the re-created bucket");
    let listed = listed_ids(&jobs, "listing").await;
    assert_eq!(listed, ["after"]);
}
