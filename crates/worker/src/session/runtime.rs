//! What a session keeps between tasks: its tools and tool table, its model
//! and prompt, its workspace and budgets, the engine of its last task and
//! what it knows of its stored checkpoint.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mtswarm_bus::v1;
use mtswarm_core::{ChatModel, Engine, EngineConfig, RiskPolicy, ToolRegistry, TracingMiddleware};
use mtswarm_tools::ToolSet;

use crate::checkpoint::{KnownCheckpoint, SessionCheckpointCell};
use crate::workspace::{KernelDirError, ensure_kernel_copy, resolve_kernel_dir};

/// What a session keeps between tasks.
pub(super) struct SessionRuntime {
    pub(super) tools: ToolSet,
    /// The session's tool table, built once; each task's engine gets a clone.
    pub(super) registry: ToolRegistry,
    pub(super) model: Arc<dyn ChatModel>,
    pub(super) system_prompt: String,
    pub(super) workspace: std::path::PathBuf,
    pub(super) policy: RiskPolicy,
    pub(super) kernel_dir: String,
    pub(super) budgets: v1::Budgets,
    pub(super) hardware_tools: Vec<String>,
    pub(super) temperature: Option<f32>,
    pub(super) max_output_tokens: Option<u32>,
    /// The engine of the session's last task and the configuration it was
    /// built with. Building one clones the whole tool table, which costs
    /// more than a no-op task itself; tasks with the same configuration
    /// (the common case) share it, each with its own checkpoint sink.
    pub(super) engine: Mutex<Option<(EngineConfig, Engine)>>,
    /// Kernel directories already copied into the workspace, by the name a
    /// task gave them, with the copy's name.
    pub(super) kernel_copies: Mutex<HashMap<String, String>>,
    /// What the session knows of its stored checkpoint (see
    /// [`crate::checkpoint`]).
    pub(super) checkpoint: SessionCheckpointCell,
}

impl SessionRuntime {
    /// An engine for `config`: the cached one when the configuration is the
    /// same, otherwise a new one (which replaces it in the cache).
    pub(super) fn engine_for(&self, config: EngineConfig) -> Engine {
        let mut cached = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cached_config, engine)) = cached.as_ref()
            && *cached_config == config
        {
            return engine.clone();
        }
        // Schemas were compiled once for the session; the clone shares them.
        let engine = Engine::new(
            config.clone(),
            self.model.clone(),
            self.registry.clone(),
            self.policy.clone(),
            Arc::new(self.tools.resource_lock()),
        )
        .with_middleware(Arc::new(TracingMiddleware::with_message_content(
            mtswarm_telemetry::capture_message_content(),
        )))
        .with_middleware(Arc::new(mtswarm_llm::MetricsMiddleware::new()));
        *cached = Some((config, engine.clone()));
        engine
    }

    /// Copy `kernel_dir` into the workspace once per session (see
    /// [`ensure_kernel_copy`]) and name its pristine sources to the tools;
    /// later tasks naming it again find the copy.
    pub(super) fn kernel_copy(
        &self,
        kernel_root: &std::path::Path,
        kernel_dir: &str,
    ) -> Result<String, KernelDirError> {
        let known = self
            .kernel_copies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(kernel_dir)
            .cloned();
        if let Some(name) = known
            && self.workspace.join(&name).is_dir()
        {
            return Ok(name);
        }
        let name = ensure_kernel_copy(kernel_root, &self.workspace, kernel_dir)?;
        // The kernel root's copy is the pristine source every build of the
        // session is diffed against (the workspace may hold earlier edits).
        let (origin, _) = resolve_kernel_dir(kernel_root, kernel_dir)?;
        if let Err(error) = self.tools.register_pristine(&name, &origin) {
            tracing::warn!(%error, kernel_dir, "cannot register the pristine kernel sources");
        }
        self.kernel_copies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kernel_dir.to_owned(), name.clone());
        Ok(name)
    }

    /// Remember a checkpoint read from the store.
    pub(super) fn saw_checkpoint(&self, stored: &mtswarm_bus::Versioned<v1::SessionCheckpoint>) {
        *self.checkpoint.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(KnownCheckpoint::of_stored(stored));
    }
}
