//! Device code as the emulator runs it: the kernel's WebAssembly module,
//! checked against the device contract and rewritten so that it pays for
//! what it does and touches only what it may.
//!
//! `kernel.c` is compiled by clang for `wasm32` with no C library and linked
//! with wasm-ld; what comes out is untrusted. [`prepare`] accepts it only if
//! it uses nothing beyond the MVP, SIMD, sign extension and saturating
//! conversions, imports only the contract's functions ([`super::contract`])
//! and one memory, and defines no memory, start function or global but the
//! compiler's stack pointer. It then
//!
//! - adds the accounting as globals the C code cannot address
//!   ([`globals`]) and exports them to the host;
//! - charges every straight-line sequence and checks every memory access
//!   ([`body`], [`slow`]);
//! - makes the memory import shared (each core is an instance on its own
//!   thread) and takes the data segments out: the runtime writes the image
//!   once per launch.
//!
//! The same pass runs at build time (so a refused module is a compile error
//! with its reason) and again at every launch from the linked module, so
//! the figures never depend on anything a build left behind.

use std::collections::BTreeMap;

use wasm_encoder::reencode::{Reencode, RoundtripReencoder, utils};
use wasm_encoder::{
    CodeSection, ConstExpr, CustomSection, ElementSection, EntityType, ExportKind, ExportSection,
    FunctionSection, GlobalSection, GlobalType, ImportSection, MemoryType, Module, TableSection,
    TypeSection,
};
use wasmparser::{Parser, Payload, TypeRef, ValType, Validator, WasmFeatures};

use super::contract::Import;
use super::layout::{Layout, MAX_PAGES};
use crate::error::HwError;
use crate::spec::ChipSpec;

mod body;
mod checks;
mod context;
pub(crate) mod globals;
mod ops;
mod reading;
mod slow;

use context::{bad_module, reencode_error};
use globals::{COUNT, Counter, STACK_POINTER_EXPORT, State};
use reading::{Reading, refuse};

/// An instrumented kernel, ready to instantiate once per core.
#[derive(Debug, Clone)]
pub(crate) struct Device {
    /// The rewritten module.
    pub(crate) wasm: Vec<u8>,
    /// Its memory map.
    pub(crate) layout: Layout,
    /// The kernel image: (address, bytes) of each data segment.
    pub(crate) segments: Vec<(u32, Vec<u8>)>,
    /// Exported functions and their parameter types (the kernels a host
    /// may launch).
    pub(crate) kernels: BTreeMap<String, Vec<ValType>>,
    /// The contract functions the module imports, in import order.
    pub(crate) imports: Vec<&'static Import>,
}

fn features() -> WasmFeatures {
    WasmFeatures::WASM1
        | WasmFeatures::SIGN_EXTENSION
        | WasmFeatures::SATURATING_FLOAT_TO_INT
        | WasmFeatures::MULTI_VALUE
        | WasmFeatures::SIMD
}

/// Check a linked kernel module against the device contract and
/// instrument it for `spec`.
pub(crate) fn prepare(wasm: &[u8], spec: &ChipSpec) -> Result<Device, HwError> {
    Validator::new_with_features(features())
        .validate_all(wasm)
        .map_err(|e| {
            refuse(format!(
                "the compiled module uses a WebAssembly feature device code may not ({e})"
            ))
        })?;
    let reading = reading::read(wasm)?;
    let image = reading::static_image(&reading)?;
    let layout = Layout::new(image, spec)?;
    let mut kernels = BTreeMap::new();
    for (name, func) in &reading.function_exports {
        let ty = reading.function_type(*func)?;
        kernels.insert(name.clone(), ty.0.clone());
    }
    let rewritten = rewrite(wasm, &reading, &layout, spec)?;
    Ok(Device {
        wasm: rewritten,
        layout,
        segments: reading.segments,
        kernels,
        imports: reading.imports,
    })
}

/// Write the instrumented module: the input's sections rewritten, then the
/// accounting added.
fn rewrite(wasm: &[u8], r: &Reading, layout: &Layout, spec: &ChipSpec) -> Result<Vec<u8>, HwError> {
    let imported = r.imports.len() as u32;
    let cx = context::Context {
        first_global: r.globals,
        slow_fn: imported + r.defined_funcs.len() as u32,
        window_len: layout.window_len(),
        am_offset: layout.am_offset(),
        units_per_issue: u64::from(spec.vector_lanes.max(2) / 2),
        scalar_slots: spec.scalar_issue_slots.max(1),
        min_sequence_cycles: spec.model.scalar_block_cycles,
        stack_pointer: r.stack_pointer.unwrap_or(0),
        stack_bytes: layout.stack_bytes,
    };
    let mut sections = Sections::default();
    sections.rewrite_input(wasm, r, &cx)?;
    sections.add_accounting(r, layout, cx.first_global)?;
    Ok(sections.assemble())
}

/// The sections of the instrumented module, in the making.
#[derive(Default)]
struct Sections<'a> {
    types: TypeSection,
    imports: ImportSection,
    functions: FunctionSection,
    tables: TableSection,
    globals: GlobalSection,
    exports: ExportSection,
    elements: ElementSection,
    code: CodeSection,
    customs: Vec<CustomSection<'a>>,
}

impl<'a> Sections<'a> {
    /// The input's sections, each function body instrumented, the memory
    /// import shared, the slow path's type and function declared; the data
    /// segments are left out (the runtime writes the image).
    fn rewrite_input(
        &mut self,
        wasm: &'a [u8],
        r: &Reading,
        cx: &context::Context,
    ) -> Result<(), HwError> {
        let mut re = RoundtripReencoder;
        let mut slow_type = 0;
        let mut func_index = r.imports.len() as u32;
        for payload in Parser::new(0).parse_all(wasm) {
            match payload.map_err(bad_module)? {
                Payload::TypeSection(section) => {
                    utils::parse_type_section(&mut re, &mut self.types, section)
                        .map_err(reencode_error)?;
                    slow_type = r.func_types.len() as u32;
                    self.types
                        .ty()
                        .function([wasm_encoder::ValType::I32; 4], []);
                }
                Payload::ImportSection(section) => self.shared_memory_imports(section)?,
                Payload::FunctionSection(section) => {
                    for ty in section {
                        self.functions.function(ty.map_err(bad_module)?);
                    }
                    self.functions.function(slow_type);
                }
                Payload::TableSection(section) => {
                    utils::parse_table_section(&mut re, &mut self.tables, section)
                        .map_err(reencode_error)?;
                }
                Payload::GlobalSection(section) => {
                    utils::parse_global_section(&mut re, &mut self.globals, section)
                        .map_err(reencode_error)?;
                }
                Payload::ElementSection(section) => {
                    utils::parse_element_section(&mut re, &mut self.elements, section)
                        .map_err(reencode_error)?;
                }
                Payload::CodeSectionEntry(entry) => {
                    let ty = r.function_type(func_index)?;
                    let name = r
                        .function_names
                        .get(&func_index)
                        .map_or_else(|| format!("function {func_index}"), Clone::clone);
                    let body = body::instrument(&entry, ty.0.len() as u32, cx, &name)?;
                    self.code.function(&body);
                    func_index += 1;
                }
                Payload::CustomSection(section) if section.name() == "name" => {
                    self.customs.push(CustomSection {
                        name: "name".into(),
                        data: section.data().to_vec().into(),
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The imports as they were, but the memory: shared (each core is an
    /// instance on its own thread) and able to grow to the device's size.
    fn shared_memory_imports(
        &mut self,
        section: wasmparser::ImportSectionReader<'_>,
    ) -> Result<(), HwError> {
        let mut re = RoundtripReencoder;
        for import in section.into_imports() {
            let import = import.map_err(bad_module)?;
            let ty = match import.ty {
                TypeRef::Memory(m) => EntityType::Memory(MemoryType {
                    minimum: m.initial,
                    maximum: Some(MAX_PAGES),
                    memory64: false,
                    shared: true,
                    page_size_log2: None,
                }),
                other => re.entity_type(other).map_err(reencode_error)?,
            };
            self.imports.import(import.module, import.name, ty);
        }
        Ok(())
    }

    /// The slow path's body, the accounting globals after the module's own,
    /// and the exports: the kernels, the accounting and the stack pointer.
    fn add_accounting(
        &mut self,
        r: &Reading,
        layout: &Layout,
        first_global: u32,
    ) -> Result<(), HwError> {
        let mut re = RoundtripReencoder;
        self.code.function(&slow::function(layout, first_global));
        if r.func_types.is_empty() {
            // No type section in the input: the slow path's type is the only one.
            self.types
                .ty()
                .function([wasm_encoder::ValType::I32; 4], []);
        }
        for slot in 0..COUNT {
            let ty = globals::val_type(slot);
            let init = if ty == ValType::I64 {
                ConstExpr::i64_const(0)
            } else {
                ConstExpr::i32_const(0)
            };
            self.globals.global(
                GlobalType {
                    val_type: re.val_type(ty).map_err(reencode_error)?,
                    mutable: true,
                    shared: false,
                },
                &init,
            );
        }
        for (name, func) in &r.function_exports {
            self.exports.export(name, ExportKind::Func, *func);
        }
        for counter in Counter::ALL {
            self.exports.export(
                counter.export(),
                ExportKind::Global,
                first_global + counter.slot(),
            );
        }
        for state in State::ALL {
            self.exports.export(
                state.export(),
                ExportKind::Global,
                first_global + state.slot(),
            );
        }
        if let Some(sp) = r.stack_pointer {
            self.exports
                .export(STACK_POINTER_EXPORT, ExportKind::Global, sp);
        }
        Ok(())
    }

    /// The module, its sections in the order WebAssembly requires.
    fn assemble(self) -> Vec<u8> {
        let mut module = Module::new();
        module
            .section(&self.types)
            .section(&self.imports)
            .section(&self.functions);
        if !self.tables.is_empty() {
            module.section(&self.tables);
        }
        module.section(&self.globals).section(&self.exports);
        if !self.elements.is_empty() {
            module.section(&self.elements);
        }
        module.section(&self.code);
        for custom in &self.customs {
            module.section(custom);
        }
        module.finish()
    }
}
