//! One agent the job spawned, as the job's state holds it and as its key
//! in the jobs bucket stores it (`AgentPlacement`).

use mtswarm_bus::v1;

/// One agent the job spawned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentEntry {
    /// The agent's id in the job (the `spawn_agent` name).
    pub agent_id: String,
    /// The worker session that runs it (kept when the agent moves).
    pub session_id: String,
    /// The worker daemon it runs on.
    pub worker_id: String,
    /// The slice it runs on.
    pub slice_id: String,
    /// The worker daemon's gRPC endpoint.
    pub endpoint: String,
    /// The worker's record key from its registration when the agent was
    /// placed there: the agent's task grants name it.
    pub worker_key: String,
    /// The agent's role (e.g. `tuner`).
    pub role: String,
    /// Its standing instructions.
    pub instructions: String,
    /// Cancelled: no more tasks, never moved.
    pub cancelled: bool,
    /// Call key of the `spawn_agent` call that created the agent.
    pub spawn_call_id: String,
    /// Times the session was moved to another slice.
    pub moves: u32,
    /// A `SpawnSession` for this placement is in flight: the slice's lease
    /// does not name the session yet, so the reassigner leaves it alone.
    pub spawning: bool,
}

impl AgentEntry {
    /// The durable form stored under the agent's key.
    pub(crate) fn to_placement(&self) -> v1::AgentPlacement {
        v1::AgentPlacement {
            agent_id: self.agent_id.clone(),
            session_id: self.session_id.clone(),
            worker_id: self.worker_id.clone(),
            slice_id: self.slice_id.clone(),
            endpoint: self.endpoint.clone(),
            worker_key: self.worker_key.clone(),
            role: self.role.clone(),
            instructions: self.instructions.clone(),
            cancelled: self.cancelled,
            spawn_call_id: self.spawn_call_id.clone(),
            moves: self.moves,
            // Stamped by the owner's write (`OwnerWrites`).
            owner_epoch: 0,
        }
    }

    /// An agent read back from its stored placement.
    pub(crate) fn from_placement(placement: &v1::AgentPlacement) -> Self {
        Self {
            agent_id: placement.agent_id.clone(),
            session_id: placement.session_id.clone(),
            worker_id: placement.worker_id.clone(),
            slice_id: placement.slice_id.clone(),
            endpoint: placement.endpoint.clone(),
            worker_key: placement.worker_key.clone(),
            role: placement.role.clone(),
            instructions: placement.instructions.clone(),
            cancelled: placement.cancelled,
            spawn_call_id: placement.spawn_call_id.clone(),
            moves: placement.moves,
            spawning: false,
        }
    }
}
