//! The first reading of a linked kernel module: what it imports (each
//! against the device contract), its types, functions, globals, exports
//! and data segments, and where its static image lies.

use std::collections::BTreeMap;

use wasmparser::{
    CustomSectionReader, DataKind, DataSectionReader, ExportSectionReader, ExternalKind,
    GlobalSectionReader, ImportSectionReader, KnownCustom, Name, Operator, Parser, Payload,
    TypeRef, ValType,
};

use super::context::bad_module;
use crate::emu::contract::{self, IMPORT_MODULE, Import, MEMORY_IMPORT};
use crate::emu::layout::{NULL_END, Span, StaticImage};
use crate::error::HwError;

/// The section GSM arrays are placed in (`__gsm__`).
const GSM_SECTION: &str = "mtswarm_gsm";

pub(super) fn refuse(msg: impl Into<String>) -> HwError {
    HwError::compile(format!("kernel.c: {}", msg.into()))
}

/// What the first reading of the module found.
#[derive(Default)]
pub(super) struct Reading {
    pub(super) func_types: Vec<(Vec<ValType>, Vec<ValType>)>,
    pub(super) imports: Vec<&'static Import>,
    pub(super) defined_funcs: Vec<u32>,
    pub(super) stack_pointer: Option<u32>,
    pub(super) globals: u32,
    pub(super) data_end: Option<u32>,
    pub(super) segments: Vec<(u32, Vec<u8>)>,
    pub(super) segment_names: BTreeMap<u32, String>,
    pub(super) function_names: BTreeMap<u32, String>,
    pub(super) function_exports: Vec<(String, u32)>,
}

impl Reading {
    pub(super) fn function_type(
        &self,
        func: u32,
    ) -> Result<&(Vec<ValType>, Vec<ValType>), HwError> {
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

pub(super) fn read(wasm: &[u8]) -> Result<Reading, HwError> {
    let mut pass = FirstPass::default();
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(bad_module)? {
            Payload::TypeSection(types) => {
                for ty in types.into_iter_err_on_gc_types() {
                    let ty = ty.map_err(bad_module)?;
                    pass.r
                        .func_types
                        .push((ty.params().to_vec(), ty.results().to_vec()));
                }
            }
            Payload::ImportSection(imports) => pass.imports(imports)?,
            Payload::FunctionSection(funcs) => {
                for ty in funcs {
                    pass.r.defined_funcs.push(ty.map_err(bad_module)?);
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
            Payload::GlobalSection(globals) => pass.globals(globals)?,
            Payload::ExportSection(exports) => pass.exports(exports)?,
            Payload::DataSection(data) => pass.data(data)?,
            Payload::CustomSection(section) => pass.names(&section),
            _ => {}
        }
    }
    let FirstPass {
        r, memory_imports, ..
    } = pass;
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

/// The reading under way, with what only the reading itself needs.
#[derive(Default)]
struct FirstPass {
    r: Reading,
    /// The constant value of each immutable i32 global, by index (how the
    /// `__data_end` export is found).
    global_names: BTreeMap<u32, u32>,
    memory_imports: u32,
}

impl FirstPass {
    /// Every import must be a device function of the contract or the memory.
    fn imports(&mut self, imports: ImportSectionReader<'_>) -> Result<(), HwError> {
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
                    let (params, results) = self
                        .r
                        .func_types
                        .get(ty as usize)
                        .cloned()
                        .unwrap_or_default();
                    self.r
                        .imports
                        .push(contract_import(import.name, &params, &results)?);
                }
                TypeRef::Memory(m) if import.name == MEMORY_IMPORT => {
                    if m.memory64 || m.shared {
                        return Err(refuse("the device memory must be 32-bit, unshared"));
                    }
                    self.memory_imports += 1;
                }
                _ => {
                    return Err(refuse(format!(
                        "imports `{}`, which is not a device function or the memory",
                        import.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// The one mutable global is the stack pointer; the constants are kept.
    fn globals(&mut self, globals: GlobalSectionReader<'_>) -> Result<(), HwError> {
        let r = &mut self.r;
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
                    self.global_names.insert(r.globals, value as u32);
                }
            }
            r.globals += 1;
        }
        Ok(())
    }

    fn exports(&mut self, exports: ExportSectionReader<'_>) -> Result<(), HwError> {
        for export in exports {
            let export = export.map_err(bad_module)?;
            match export.kind {
                ExternalKind::Func => self
                    .r
                    .function_exports
                    .push((export.name.to_owned(), export.index)),
                ExternalKind::Global if export.name == "__data_end" => {
                    self.r.data_end = self.global_names.get(&export.index).copied();
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every data segment is active, at a constant address.
    fn data(&mut self, data: DataSectionReader<'_>) -> Result<(), HwError> {
        for segment in data {
            let segment = segment.map_err(bad_module)?;
            let DataKind::Active { offset_expr, .. } = segment.kind else {
                return Err(refuse("has a passive data segment"));
            };
            let mut ops = offset_expr.get_operators_reader();
            let Ok(Operator::I32Const { value }) = ops.read() else {
                return Err(refuse("a data segment has no constant address"));
            };
            self.r.segments.push((value as u32, segment.data.to_vec()));
        }
        Ok(())
    }

    /// The names of data segments and functions, from the name section.
    fn names(&mut self, section: &CustomSectionReader<'_>) {
        let KnownCustom::Name(names) = section.as_known() else {
            return;
        };
        for name in names {
            match name {
                Ok(Name::Data(map)) => {
                    for naming in map.into_iter().flatten() {
                        self.r
                            .segment_names
                            .insert(naming.index, naming.name.to_owned());
                    }
                }
                Ok(Name::Function(map)) => {
                    for naming in map.into_iter().flatten() {
                        self.r
                            .function_names
                            .insert(naming.index, naming.name.to_owned());
                    }
                }
                _ => {}
            }
        }
    }
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
pub(super) fn static_image(r: &Reading) -> Result<StaticImage, HwError> {
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
