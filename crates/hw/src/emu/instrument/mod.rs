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
use wasmparser::{
    DataKind, ExternalKind, KnownCustom, Name, Operator, Parser, Payload, TypeRef, ValType,
    Validator, WasmFeatures,
};

use super::contract::{self, IMPORT_MODULE, Import, MEMORY_IMPORT};
use super::layout::{Layout, MAX_PAGES, NULL_END, Span, StaticImage};
use crate::HwError;
use crate::spec::ChipSpec;

mod body;
mod checks;
mod context;
pub(crate) mod globals;
mod ops;
mod slow;

use body::{bad_module, reencode_error};
use globals::{COUNT, Counter, STACK_POINTER_EXPORT, State};

/// The section GSM arrays are placed in (`__gsm__`).
const GSM_SECTION: &str = "mtswarm_gsm";

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

fn refuse(msg: impl Into<String>) -> HwError {
    HwError::compile(format!("kernel.c: {}", msg.into()))
}

/// What the first reading of the module found.
#[derive(Default)]
struct Reading {
    func_types: Vec<(Vec<ValType>, Vec<ValType>)>,
    imports: Vec<&'static Import>,
    defined_funcs: Vec<u32>,
    stack_pointer: Option<u32>,
    globals: u32,
    data_end: Option<u32>,
    segments: Vec<(u32, Vec<u8>)>,
    segment_names: BTreeMap<u32, String>,
    function_names: BTreeMap<u32, String>,
    function_exports: Vec<(String, u32)>,
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
    let reading = read(wasm)?;
    let image = static_image(&reading)?;
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

impl Reading {
    fn function_type(&self, func: u32) -> Result<&(Vec<ValType>, Vec<ValType>), HwError> {
        let imported = self.imports.len() as u32;
        let ty = if func < imported {
            return Err(refuse(format!("function {func} is an import")));
        } else {
            self.defined_funcs
                .get((func - imported) as usize)
                .copied()
                .ok_or_else(|| refuse(format!("no function {func}")))?
        };
        self.func_types
            .get(ty as usize)
            .ok_or_else(|| refuse(format!("no type {ty}")))
    }
}

fn read(wasm: &[u8]) -> Result<Reading, HwError> {
    let mut r = Reading::default();
    let mut global_names = BTreeMap::new();
    let mut memory_imports = 0;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(bad_module)? {
            Payload::TypeSection(types) => {
                for ty in types.into_iter_err_on_gc_types() {
                    let ty = ty.map_err(bad_module)?;
                    r.func_types
                        .push((ty.params().to_vec(), ty.results().to_vec()));
                }
            }
            Payload::ImportSection(imports) => {
                for import in imports.into_imports() {
                    let import = import.map_err(bad_module)?;
                    if import.module != IMPORT_MODULE {
                        return Err(refuse(format!(
                            "imports `{}.{}`: device code imports only from `{IMPORT_MODULE}`",
                            import.module, import.name
                        )));
                    }
                    match import.ty {
                        TypeRef::Func(ty) => {
                            let (params, results) =
                                r.func_types.get(ty as usize).cloned().unwrap_or_default();
                            r.imports
                                .push(contract_import(import.name, &params, &results)?);
                        }
                        TypeRef::Memory(m) if import.name == MEMORY_IMPORT => {
                            if m.memory64 || m.shared {
                                return Err(refuse("the device memory must be 32-bit, unshared"));
                            }
                            memory_imports += 1;
                        }
                        _ => {
                            return Err(refuse(format!(
                                "imports `{}`, which is not a device function or the memory",
                                import.name
                            )));
                        }
                    }
                }
            }
            Payload::FunctionSection(funcs) => {
                for ty in funcs {
                    r.defined_funcs.push(ty.map_err(bad_module)?);
                }
            }
            Payload::MemorySection(_) => {
                return Err(refuse(
                    "defines its own memory; device memory is the runtime's",
                ));
            }
            Payload::StartSection { .. } => {
                return Err(refuse(
                    "has a start function; device code runs only when launched",
                ));
            }
            Payload::GlobalSection(globals) => {
                for global in globals {
                    let global = global.map_err(bad_module)?;
                    if global.ty.mutable {
                        if r.stack_pointer.is_some() || global.ty.content_type != ValType::I32 {
                            return Err(refuse(
                                "defines WebAssembly globals of its own; device state lives in memory",
                            ));
                        }
                        r.stack_pointer = Some(r.globals);
                    } else if global.ty.content_type == ValType::I32 {
                        let mut ops = global.init_expr.get_operators_reader();
                        if let Ok(Operator::I32Const { value }) = ops.read() {
                            global_names.insert(r.globals, value as u32);
                        }
                    }
                    r.globals += 1;
                }
            }
            Payload::ExportSection(exports) => {
                for export in exports {
                    let export = export.map_err(bad_module)?;
                    match export.kind {
                        ExternalKind::Func => r
                            .function_exports
                            .push((export.name.to_owned(), export.index)),
                        ExternalKind::Global if export.name == "__data_end" => {
                            r.data_end = global_names.get(&export.index).copied();
                        }
                        _ => {}
                    }
                }
            }
            Payload::DataSection(data) => {
                for segment in data {
                    let segment = segment.map_err(bad_module)?;
                    let DataKind::Active { offset_expr, .. } = segment.kind else {
                        return Err(refuse("has a passive data segment"));
                    };
                    let mut ops = offset_expr.get_operators_reader();
                    let Ok(Operator::I32Const { value }) = ops.read() else {
                        return Err(refuse("a data segment has no constant address"));
                    };
                    r.segments.push((value as u32, segment.data.to_vec()));
                }
            }
            Payload::CustomSection(section) => {
                if let KnownCustom::Name(names) = section.as_known() {
                    for name in names {
                        match name {
                            Ok(Name::Data(map)) => {
                                for naming in map.into_iter().flatten() {
                                    r.segment_names.insert(naming.index, naming.name.to_owned());
                                }
                            }
                            Ok(Name::Function(map)) => {
                                for naming in map.into_iter().flatten() {
                                    r.function_names
                                        .insert(naming.index, naming.name.to_owned());
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if memory_imports != 1 {
        return Err(refuse(format!(
            "imports {memory_imports} memories; device code imports exactly `{IMPORT_MODULE}.{MEMORY_IMPORT}`"
        )));
    }
    if r.stack_pointer.is_none() {
        return Err(refuse("has no stack pointer (was it linked by wasm-ld?)"));
    }
    Ok(r)
}

/// The contract entry for an import, or the reason it is refused.
fn contract_import(
    name: &str,
    params: &[ValType],
    results: &[ValType],
) -> Result<&'static Import, HwError> {
    let Some(import) = contract::lookup(name) else {
        return Err(refuse(format!(
            "calls `{name}`, which the device does not have{}",
            crate::device_check::host_facility_reason(name)
                .map(|why| format!(" ({why})"))
                .unwrap_or_default()
        )));
    };
    if import.params != params || import.results != results {
        return Err(refuse(format!(
            "declares `{name}` as {} but the device's is {}",
            contract::signature(params, results),
            contract::signature(import.params, import.results)
        )));
    }
    Ok(import)
}

/// Where the kernel image lies, from its segments and `__data_end`.
fn static_image(r: &Reading) -> Result<StaticImage, HwError> {
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    let mut gsm = (u64::MAX, 0u64);
    let mut rodata = (u64::MAX, 0u64);
    for (i, (at, bytes)) in r.segments.iter().enumerate() {
        let start = u64::from(*at);
        let end = start + bytes.len() as u64;
        if start < u64::from(NULL_END) {
            return Err(refuse(format!(
                "places data at address {start}, below the kernel image"
            )));
        }
        lo = lo.min(start);
        hi = hi.max(end);
        let name = r.segment_names.get(&(i as u32)).map(String::as_str);
        if name == Some(GSM_SECTION) {
            gsm = (gsm.0.min(start), gsm.1.max(end));
        } else if name.is_some_and(|n| n.starts_with(".rodata")) {
            rodata = (rodata.0.min(start), rodata.1.max(end));
        }
    }
    if let Some(end) = r.data_end {
        hi = hi.max(u64::from(end));
        lo = lo.min(u64::from(NULL_END));
    }
    let span = |(lo, hi): (u64, u64)| -> Result<Span, HwError> {
        if lo >= hi {
            return Ok(Span::default());
        }
        let len = u32::try_from(hi - lo)
            .map_err(|_| HwError::Capacity("the kernel image exceeds 4 GiB".into()))?;
        Ok(Span::new(lo as u32, len))
    };
    Ok(StaticImage {
        all: span((lo, hi))?,
        gsm: span(gsm)?,
        rodata: span(rodata)?,
    })
}

/// Write the instrumented module.
fn rewrite(wasm: &[u8], r: &Reading, layout: &Layout, spec: &ChipSpec) -> Result<Vec<u8>, HwError> {
    let mut re = RoundtripReencoder;
    let imported = r.imports.len() as u32;
    let slow_fn = imported + r.defined_funcs.len() as u32;
    let first_global = r.globals;
    let cx = context::Context {
        first_global,
        slow_fn,
        window_len: layout.window_len(),
        am_offset: layout.am_offset(),
        units_per_issue: u64::from(spec.vector_lanes.max(2) / 2),
        scalar_slots: spec.scalar_issue_slots.max(1),
        min_sequence_cycles: spec.model.scalar_block_cycles,
        stack_pointer: r.stack_pointer.unwrap_or(0),
        stack_bytes: layout.stack_bytes,
    };
    let mut types = TypeSection::new();
    let mut imports = ImportSection::new();
    let mut functions = FunctionSection::new();
    let mut tables = TableSection::new();
    let mut globals = GlobalSection::new();
    let mut exports = ExportSection::new();
    let mut elements = ElementSection::new();
    let mut code = CodeSection::new();
    let mut customs: Vec<CustomSection<'_>> = Vec::new();
    let mut slow_type = 0;
    let mut func_index = imported;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(bad_module)? {
            Payload::TypeSection(section) => {
                utils::parse_type_section(&mut re, &mut types, section).map_err(reencode_error)?;
                slow_type = r.func_types.len() as u32;
                types.ty().function([wasm_encoder::ValType::I32; 4], []);
            }
            Payload::ImportSection(section) => {
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
                    imports.import(import.module, import.name, ty);
                }
            }
            Payload::FunctionSection(section) => {
                for ty in section {
                    functions.function(ty.map_err(bad_module)?);
                }
                functions.function(slow_type);
            }
            Payload::TableSection(section) => {
                utils::parse_table_section(&mut re, &mut tables, section)
                    .map_err(reencode_error)?;
            }
            Payload::GlobalSection(section) => {
                utils::parse_global_section(&mut re, &mut globals, section)
                    .map_err(reencode_error)?;
            }
            Payload::ElementSection(section) => {
                utils::parse_element_section(&mut re, &mut elements, section)
                    .map_err(reencode_error)?;
            }
            Payload::CodeSectionEntry(entry) => {
                let ty = r.function_type(func_index)?;
                let name = r
                    .function_names
                    .get(&func_index)
                    .map_or_else(|| format!("function {func_index}"), Clone::clone);
                code.function(&body::instrument(&entry, ty.0.len() as u32, &cx, &name)?);
                func_index += 1;
            }
            Payload::CustomSection(section) if section.name() == "name" => {
                customs.push(CustomSection {
                    name: "name".into(),
                    data: section.data().to_vec().into(),
                });
            }
            _ => {}
        }
    }
    code.function(&slow::function(layout, first_global));
    if r.func_types.is_empty() {
        // No type section in the input: the slow path's type is the only one.
        types.ty().function([wasm_encoder::ValType::I32; 4], []);
    }
    for slot in 0..COUNT {
        let ty = globals::val_type(slot);
        let init = if ty == ValType::I64 {
            ConstExpr::i64_const(0)
        } else {
            ConstExpr::i32_const(0)
        };
        globals.global(
            GlobalType {
                val_type: re.val_type(ty).map_err(reencode_error)?,
                mutable: true,
                shared: false,
            },
            &init,
        );
    }
    for (name, func) in &r.function_exports {
        exports.export(name, ExportKind::Func, *func);
    }
    for counter in Counter::ALL {
        exports.export(
            counter.export(),
            ExportKind::Global,
            first_global + counter.slot(),
        );
    }
    for state in State::ALL {
        exports.export(
            state.export(),
            ExportKind::Global,
            first_global + state.slot(),
        );
    }
    if let Some(sp) = r.stack_pointer {
        exports.export(STACK_POINTER_EXPORT, ExportKind::Global, sp);
    }

    let mut module = Module::new();
    module.section(&types).section(&imports).section(&functions);
    if !tables.is_empty() {
        module.section(&tables);
    }
    module.section(&globals).section(&exports);
    if !elements.is_empty() {
        module.section(&elements);
    }
    module.section(&code);
    for custom in &customs {
        module.section(custom);
    }
    Ok(module.finish())
}
