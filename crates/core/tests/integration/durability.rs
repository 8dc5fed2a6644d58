//! Which states the engine tells its sink to store before the run goes on:
//! a batch that touches anything outside the process is entered durably,
//! a read-only one is not; every batch's results, a pause and the end are.

use std::sync::{Arc, Mutex};

use crate::common::*;
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_core::*;

/// Every state handed over: its node, step and durability.
#[derive(Default)]
struct Recorded(Mutex<Vec<(Node, u32, Durability)>>);

#[async_trait::async_trait]
impl CheckpointSink for Recorded {
    async fn save(&self, state: &LoopState, durability: Durability) -> Result<(), CheckpointError> {
        self.0
            .lock()
            .expect("lock")
            .push((state.node(), state.step(), durability));
        Ok(())
    }
}

/// The durability the states at `node` of `step` were handed with.
fn at(recorded: &[(Node, u32, Durability)], node: Node, step: u32) -> Vec<Durability> {
    recorded
        .iter()
        .filter(|(n, s, _)| *n == node && *s == step)
        .map(|(_, _, d)| *d)
        .collect()
}

#[tokio::test]
async fn only_a_batch_touching_the_outside_is_entered_durably() {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![
            ScriptedTurn::call("r1", "read_file", "{}"),
            ScriptedTurn::call("w1", "write_file", "{}"),
            ScriptedTurn::call("h1", "run_on_slice", "{}"),
            ScriptedTurn::tool_calls([
                call("r2", "read_file", "{}"),
                call("h2", "run_on_slice", "{}"),
            ]),
            ScriptedTurn::call("x1", "no_such_tool", "{}"),
            ScriptedTurn::call("b1", "build", "{}"),
            ScriptedTurn::text("done"),
        ],
        registry(vec![
            FnTool::echo("read_file", "int a;").declaring(&[]),
            FnTool::echo("write_file", "wrote").writes(),
            FnTool::echo("run_on_slice", "ran").hardware("slice"),
            // Read-only and off the hardware, but it reports state (as a
            // build reports its artifact): its batch is entered durably.
            FnTool::echo("build", "built").declaring(&[EffectKind::State]),
        ]),
        auto_all(),
    );
    let sink = Arc::new(Recorded::default());
    let (stream, _) =
        engine
            .with_checkpoint_sink(sink.clone())
            .start("s1", "You run tools.", "Run them.");
    let (_, outcome) = run(stream).await;
    assert!(matches!(outcome, Outcome::Final { .. }), "{outcome:?}");
    let recorded = sink.0.lock().expect("lock").clone();
    use Durability::{Deferrable, Required};
    // Step 1 reads only; 2 writes; 3 takes the slice; 4 mixes a read with
    // a hardware call; 5 names an unknown tool, refused at routing; 6
    // declares effects.
    let entered: Vec<Vec<Durability>> = (1..=6)
        .map(|step| at(&recorded, Node::ToolExecution, step))
        .collect();
    assert_eq!(
        entered,
        vec![
            vec![Deferrable],
            vec![Required],
            vec![Required],
            vec![Required],
            vec![Deferrable],
            vec![Required],
        ],
        "{recorded:?}"
    );
    for step in 1..=6 {
        assert_eq!(
            at(&recorded, Node::Observation, step),
            vec![Required],
            "a batch's results are durable at step {step}: {recorded:?}"
        );
        assert!(
            at(&recorded, Node::Reasoning, step)
                .iter()
                .all(|d| *d == Deferrable),
            "{recorded:?}"
        );
    }
    let done: Vec<Durability> = recorded
        .iter()
        .filter(|(n, _, _)| *n == Node::Done)
        .map(|(_, _, d)| *d)
        .collect();
    assert_eq!(done, vec![Required], "{recorded:?}");
}
