//! PyTorch checkpoints read without Python: the tensors of a `torch.save` file, in its zip
//! format (PyTorch ≥ 1.6: `NAME/data.pkl` + one `NAME/data/KEY` entry per storage) or its legacy
//! one (pickles of a magic number, a version, system facts and the object, then the storages one
//! after another), by name. This is how torchvision (`.pth`), Unicom (`.pt`), BYOL/MoCo
//! conversions (`.pth.tar`) and older Hugging Face models (`pytorch_model.bin`) ship weights.
//!
//! A pickle is a program for a small stack machine; `Machine` runs the opcodes a checkpoint
//! uses (protocols 0–5, without out-of-band buffers) *symbolically*: a `GLOBAL` is a name, never
//! an import, and calling it (`REDUCE`, `NEWOBJ`) builds a value only for the few functions that
//! rebuild containers and tensors (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`
//! and `_v3`, `_rebuild_parameter`, ...); any other call is an opaque object that keeps its
//! `BUILD` state and its items. Nothing in the file is ever executed, so a checkpoint cannot run
//! code here as `torch.load(weights_only=False)` would.
//!
//! Which tensors, under which names ([`Checkpoint::tensors`]):
//! - a state dict (a dict whose values include tensors) gives its keys;
//! - a training checkpoint (`{"epoch": 3, "state_dict": {...}, "best_acc1": tensor(71.2),
//!   "optimizer": {...}}`) gives the tensors of the string-keyed entry that holds the most, when
//!   that is more than the top level holds itself; an optimizer's state (`state` beside
//!   `param_groups`) never counts, and two entries holding as many (a student and a teacher)
//!   are refused rather than guessed; a `state_dict` beside its moving average (`model_ema`
//!   in mobile-vision's model zoo, `state_dict_ema` in timm's) gives the average, whichever
//!   holds more, as those publishers' loaders read it; [`Checkpoint::entry`] says which was
//!   read;
//! - a pickled module (`torch.save(model)`) gives what its `state_dict()` would: parameters,
//!   persistent buffers and those of its submodules (a plain tensor attribute, such as a cached
//!   attention mask, is not a weight); a TorchScript archive gives what its `state_dict()`
//!   would, the attributes its `code/` declares as parameters and buffers;
//! - a dict subclass (`defaultdict`, `EasyDict`) is read as a dict;
//! - a `module.` prefix on every name (a `DistributedDataParallel` wrapper) is removed.
//!
//! Tensors are gathered in row-major order from any strides and storage offset. A zip whose
//! `byteorder` is `big` is swapped; legacy storages are little-endian whatever the file's header
//! says (torch writes and reads them so). A tensor of a type curate does not read (complex,
//! float8, unsigned 16–64-bit) or an expanded view past 1 GiB comes without
//! bytes ([`TorchTensor::dtype`] `None`): it fails a load only if a model asks for it.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;

use crate::error::{Error, Result};

/// A storage's element type, as `torch.XStorage` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchDtype {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl TorchDtype {
    /// A `torch.<name>` dtype (`_rebuild_tensor_v3`'s argument).
    fn from_name(name: &str) -> Option<TorchDtype> {
        Some(match name {
            "float64" | "double" => TorchDtype::F64,
            "float32" | "float" => TorchDtype::F32,
            "float16" | "half" => TorchDtype::F16,
            "bfloat16" => TorchDtype::BF16,
            "int64" | "long" => TorchDtype::I64,
            "int32" | "int" => TorchDtype::I32,
            "int16" | "short" => TorchDtype::I16,
            "int8" => TorchDtype::I8,
            "uint8" => TorchDtype::U8,
            "bool" => TorchDtype::Bool,
            _ => return None,
        })
    }

    fn from_storage(name: &str) -> Option<TorchDtype> {
        Some(match name {
            "DoubleStorage" => TorchDtype::F64,
            "FloatStorage" => TorchDtype::F32,
            "HalfStorage" => TorchDtype::F16,
            "BFloat16Storage" => TorchDtype::BF16,
            "LongStorage" => TorchDtype::I64,
            "IntStorage" => TorchDtype::I32,
            "ShortStorage" => TorchDtype::I16,
            "CharStorage" => TorchDtype::I8,
            "ByteStorage" => TorchDtype::U8,
            "BoolStorage" => TorchDtype::Bool,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            TorchDtype::F64 | TorchDtype::I64 => 8,
            TorchDtype::F32 | TorchDtype::I32 => 4,
            TorchDtype::F16 | TorchDtype::BF16 | TorchDtype::I16 => 2,
            TorchDtype::I8 | TorchDtype::U8 | TorchDtype::Bool => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TorchDtype::F64 => "float64",
            TorchDtype::F32 => "float32",
            TorchDtype::F16 => "float16",
            TorchDtype::BF16 => "bfloat16",
            TorchDtype::I64 => "int64",
            TorchDtype::I32 => "int32",
            TorchDtype::I16 => "int16",
            TorchDtype::I8 => "int8",
            TorchDtype::U8 => "uint8",
            TorchDtype::Bool => "bool",
        }
    }

    /// Whether curate reads it as weights (the floating-point types).
    pub fn is_float(self) -> bool {
        matches!(self, TorchDtype::F64 | TorchDtype::F32 | TorchDtype::F16 | TorchDtype::BF16)
    }
}

/// One tensor of a checkpoint: its type, shape, and elements in row-major order, little-endian.
/// A tensor curate cannot read (complex, float8, unsigned 16-64-bit, an expanded view too large
/// to copy) has no type and no bytes, only `type_name` saying what it is: it fails a load only if
/// a model asks for it.
#[derive(Debug, Clone)]
pub struct TorchTensor {
    pub dtype: Option<TorchDtype>,
    pub type_name: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// The element size of storage types curate does not read as values, so that a legacy file's
/// storages can be stepped over (complex, quantised) and untyped ones addressed in bytes.
fn other_storage_size(name: &str) -> Option<usize> {
    Some(match name {
        "UntypedStorage" | "QUInt8Storage" | "QInt8Storage" | "QUInt4x2Storage" | "QUInt2x4Storage" => 1,
        "ComplexHalfStorage" | "QInt32Storage" => 4,
        "ComplexFloatStorage" => 8,
        "ComplexDoubleStorage" => 16,
        _ => return None,
    })
}

/// The tensors of a checkpoint, by name, in the order the file lists them.
#[derive(Debug)]
pub struct Checkpoint {
    pub tensors: Vec<(String, TorchTensor)>,
    /// The entry of a training checkpoint the tensors came from (`state_dict`, `model`, ...),
    /// `None` for a bare state dict or module.
    pub entry: Option<String>,
    /// Whether a `module.` prefix was removed from every name.
    pub stripped_module: bool,
}

/// The number a legacy `torch.save` file's first pickle holds.
const LEGACY_MAGIC: i128 = 0x1950_a86a_20f9_469c_fc6c;

/// Whether `head` (a file's first 64 bytes or so) begins as a `torch.save` file does: a zip
/// archive, or a legacy stream whose first pickle, in any protocol, is torch's magic number.
pub fn looks_like_torch(head: &[u8]) -> bool {
    head.starts_with(b"PK\x03\x04") || matches!(Machine::new(head).run(), Ok(Value::Int(LEGACY_MAGIC)))
}

/// Reads the checkpoint at `path`.
pub fn read(path: &Path) -> Result<Checkpoint> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("cannot read checkpoint", path, e))?;
    parse(&bytes).map_err(|message| Error::Model {
        message: format!("`{}` is not a PyTorch checkpoint curate can read: {message}", path.display()),
        hint: Some(
            "curate reads `torch.save` files of state dicts, training checkpoints holding one, pickled modules and \
             TorchScript archives; or convert the weights with `safetensors.torch.save_file(model.state_dict(), ...)`"
                .into(),
        ),
    })
}

/// Parses a checkpoint held in memory.
pub fn parse(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
    let (root, storages, big_endian, declared) = if bytes.starts_with(b"PK\x03\x04") {
        parse_zip(bytes)?
    } else {
        let (root, storages, big_endian) = parse_legacy(bytes)?;
        (root, storages, big_endian, Declared::new())
    };
    let (found, entry) = Finder { declared, visits: Default::default() }.choose(&root)?;
    if found.is_empty() {
        return Err("it holds no tensors under string keys (a state dict, or an entry holding one)".into());
    }
    let stripped_module = found.iter().all(|(n, _)| n.starts_with("module."));
    let mut tensors = Vec::with_capacity(found.len());
    let mut seen = std::collections::HashSet::new();
    for (name, t) in found {
        let name = if stripped_module { name["module.".len()..].to_owned() } else { name };
        if !seen.insert(name.clone()) {
            continue; // the same tensor reached twice (a module shared by two parents)
        }
        let tensor = materialise(&t, &storages, big_endian).map_err(|e| format!("tensor `{name}`: {e}"))?;
        tensors.push((name, tensor));
    }
    Ok(Checkpoint { tensors, entry, stripped_module })
}

// ------------------------------------------------------------------------------------------
// Containers: the zip archive and the legacy stream.

/// Storage bytes by key (borrowed from the file, or inflated from a deflated zip entry).
type Storages<'a> = HashMap<String, std::borrow::Cow<'a, [u8]>>;

fn parse_zip(bytes: &[u8]) -> std::result::Result<(Value, Storages<'_>, bool, Declared), String> {
    let entries = zip_entries(bytes)?;
    let pkl = entries
        .keys()
        .filter(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        .min()
        .ok_or("a zip archive without `NAME/data.pkl`")?
        .clone();
    let prefix = &pkl[..pkl.len() - "data.pkl".len()];
    // torch writes every entry stored; a file re-zipped with deflate still loads in torch.
    let stored = |name: &str| -> std::result::Result<Option<std::borrow::Cow<'_, [u8]>>, String> {
        match entries.get(name) {
            Some(e) if e.method == 0 => Ok(Some(std::borrow::Cow::Borrowed(e.data))),
            Some(e) if e.method == 8 => {
                // Inflated up to the size the directory declares, and no further.
                let mut out = Vec::new();
                let mut d = std::io::Read::take(flate2::read::DeflateDecoder::new(e.data), e.size.saturating_add(1));
                std::io::Read::read_to_end(&mut d, &mut out).map_err(|err| format!("`{name}`: {err}"))?;
                if out.len() as u64 != e.size {
                    return Err(format!("`{name}` inflates to {} bytes, not the {} it declares", out.len(), e.size));
                }
                Ok(Some(std::borrow::Cow::Owned(out)))
            }
            Some(e) => Err(format!("`{name}`: zip compression method {}", e.method)),
            None => Ok(None),
        }
    };
    let big_endian = match stored(&format!("{prefix}byteorder"))?.as_deref() {
        Some(b) => match b {
            b"little" => false,
            b"big" => true,
            other => return Err(format!("unknown byteorder `{}`", String::from_utf8_lossy(other))),
        },
        None => false,
    };
    let data = format!("{prefix}data/");
    let mut storages = Storages::new();
    for n in entries.keys() {
        if let Some(k) = n.strip_prefix(&data) {
            storages.insert(k.to_owned(), stored(n)?.expect("listed"));
        }
    }
    let pickle = stored(&pkl)?.expect("listed");
    let mut m = Machine::new(&pickle);
    let root = m.run()?;
    Ok((root, storages, big_endian, torchscript_declarations(&entries, prefix)?))
}

/// TorchScript's declarations of which attributes of each class are parameters and buffers
/// (`__parameters__ = ["weight", "bias", ]` and `__buffers__ = [...]` in the archive's
/// `code/`), by qualified class name (`__torch__.torch.nn.modules.linear.Linear`). Its
/// `state_dict()` holds those; other tensor attributes (a cached attention mask) are not
/// weights. Empty for an archive without `code/` (a `torch.save` file).
fn torchscript_declarations(
    entries: &BTreeMap<String, ZipEntry<'_>>,
    prefix: &str,
) -> std::result::Result<Declared, String> {
    let code = format!("{prefix}code/");
    let mut declared = Declared::new();
    let mut budget: u64 = 256 << 20; // decompressed code at most, against a zip bomb
    for (name, e) in entries {
        let Some(module) = name.strip_prefix(&code).and_then(|m| m.strip_suffix(".py")) else { continue };
        let text = match e.method {
            0 => e.data.to_vec(),
            8 => {
                let mut out = Vec::new();
                let mut d = std::io::Read::take(flate2::read::DeflateDecoder::new(e.data), budget + 1);
                std::io::Read::read_to_end(&mut d, &mut out).map_err(|err| format!("`{name}`: {err}"))?;
                if out.len() as u64 > budget {
                    return Err("TorchScript code larger than 256 MiB".into());
                }
                budget -= out.len() as u64;
                out
            }
            m => return Err(format!("`{name}`: zip compression method {m}")),
        };
        let module = module.replace('/', ".");
        let mut class: Option<String> = None;
        for line in String::from_utf8_lossy(&text).lines() {
            if let Some(rest) = line.strip_prefix("class ") {
                let n = rest.split(['(', ':']).next().unwrap_or("").trim();
                class = Some(format!("{module}.{n}"));
                continue;
            }
            let t = line.trim_start();
            let list = t.strip_prefix("__parameters__ = [").or_else(|| t.strip_prefix("__buffers__ = ["));
            if let (Some(c), Some(list)) = (&class, list) {
                let names = declared.entry(c.clone()).or_default();
                names.extend(list.split('"').skip(1).step_by(2).map(str::to_owned));
            }
        }
    }
    Ok(declared)
}

/// Parameter and buffer names by TorchScript class.
type Declared = HashMap<String, std::collections::HashSet<String>>;

/// One entry of a zip archive: its compression method (0 stored, 8 deflated), its bytes as
/// stored and its size once inflated.
struct ZipEntry<'a> {
    method: u64,
    data: &'a [u8],
    size: u64,
}

/// The entries of a zip archive by name. torch stores every entry it reads back (`data.pkl`,
/// the storages), with ZIP64 records past 4 GiB; TorchScript's `code/` is deflated.
fn zip_entries(b: &[u8]) -> std::result::Result<BTreeMap<String, ZipEntry<'_>>, String> {
    let u16_at = |o: usize| -> std::result::Result<u64, String> {
        b.get(o..o.saturating_add(2))
            .map(|s| u16::from_le_bytes([s[0], s[1]]) as u64)
            .ok_or_else(|| "truncated zip".to_string())
    };
    let u32_at = |o: usize| -> std::result::Result<u64, String> {
        b.get(o..o.saturating_add(4))
            .map(|s| u32::from_le_bytes(s.try_into().unwrap()) as u64)
            .ok_or_else(|| "truncated zip".to_string())
    };
    let u64_at = |o: usize| -> std::result::Result<u64, String> {
        b.get(o..o.saturating_add(8))
            .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
            .ok_or_else(|| "truncated zip".to_string())
    };
    // End of central directory: the last signature within the final 64 KiB + 22 bytes.
    let from = b.len().saturating_sub(65_557);
    let eocd = (from..b.len().saturating_sub(21))
        .rev()
        .find(|&o| b[o..o + 4] == [0x50, 0x4b, 0x05, 0x06])
        .ok_or("no end-of-central-directory record (truncated?)")?;
    let (mut count, mut cd_offset) = (u16_at(eocd + 10)?, u32_at(eocd + 16)?);
    if (count == 0xffff || cd_offset == 0xffff_ffff)
        && eocd >= 20
        && b[eocd - 20..eocd - 16] == [0x50, 0x4b, 0x06, 0x07]
    {
        let rec = usize::try_from(u64_at(eocd - 12)?).unwrap_or(usize::MAX);
        if b.get(rec..rec.saturating_add(4)) != Some(&[0x50, 0x4b, 0x06, 0x06][..]) {
            return Err("a ZIP64 locator without its record".into());
        }
        count = u64_at(rec + 32)?;
        cd_offset = u64_at(rec + 48)?;
    }
    let mut out = BTreeMap::new();
    // Offsets and sizes come from the file: added saturating, so that a damaged one fails the
    // bounds check after it rather than overflowing.
    let at = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let mut o = at(cd_offset);
    for _ in 0..count {
        if u32_at(o)? != 0x0201_4b50 {
            return Err("a broken central directory".into());
        }
        let method = u16_at(o + 10)?;
        let (mut csize, mut usize_, mut local) = (u32_at(o + 20)?, u32_at(o + 24)?, u32_at(o + 42)?);
        let (n, e, c) = (u16_at(o + 28)? as usize, u16_at(o + 30)? as usize, u16_at(o + 32)? as usize);
        let name = String::from_utf8_lossy(b.get(o + 46..o + 46 + n).ok_or("truncated zip")?).into_owned();
        // ZIP64 extra field: the sizes and offset that did not fit, in this order.
        let mut x = o + 46 + n;
        let end = x + e;
        while x.saturating_add(4) <= end {
            let (id, len) = (u16_at(x)?, u16_at(x + 2)? as usize);
            if id == 1 {
                let mut p = x + 4;
                for field in [&mut usize_, &mut csize, &mut local] {
                    if *field == 0xffff_ffff {
                        *field = u64_at(p)?;
                        p += 8;
                    }
                }
            }
            x += 4 + len;
        }
        let l = at(local);
        if u32_at(l)? != 0x0403_4b50 {
            return Err(format!("entry `{name}`: no local header"));
        }
        let start = l + 30 + u16_at(l + 26)? as usize + u16_at(l + 28)? as usize;
        if method == 0 && csize != usize_ {
            return Err(format!("entry `{name}`: stored, yet its sizes differ"));
        }
        let data =
            b.get(start..start.saturating_add(at(csize))).ok_or_else(|| format!("entry `{name}` runs past the end"))?;
        out.insert(name, ZipEntry { method, data, size: usize_ });
        o += 46 + n + e + c;
    }
    Ok(out)
}

fn parse_legacy(bytes: &[u8]) -> std::result::Result<(Value, Storages<'_>, bool), String> {
    let mut m = Machine::new(bytes);
    match m.run()? {
        Value::Int(LEGACY_MAGIC) => {}
        _ => return Err("neither a zip archive nor a legacy `torch.save` stream (no magic number)".into()),
    }
    match m.run()? {
        Value::Int(1001) => {}
        v => return Err(format!("a legacy protocol version of {}, not 1001", kind(&v))),
    }
    // System facts; their `little_endian` is not about the data: torch writes legacy storages
    // little-endian on every machine, and reads them so.
    let _info = m.run()?;
    let root = m.run()?;
    let keys = match m.run()? {
        Value::List(l) => l.borrow().clone(),
        _ => return Err("no list of storage keys after the object".into()),
    };
    let dtypes = m.legacy_storages;
    let mut pos = m.pos;
    let mut storages = Storages::new();
    for k in keys {
        let Value::Str(k) = k else { return Err("a storage key that is not a string".into()) };
        let size = *dtypes.get(&*k).ok_or_else(|| format!("storage `{k}` is not used by any tensor"))?;
        let n = bytes.get(pos..pos + 8).ok_or_else(|| format!("storage `{k}` runs past the end"))?;
        let numel = u64::from_le_bytes(n.try_into().unwrap()) as usize;
        let len = numel.checked_mul(size).ok_or("storage size overflows")?;
        let data = len
            .checked_add(pos + 8)
            .and_then(|end| bytes.get(pos + 8..end))
            .ok_or_else(|| format!("storage `{k}` runs past the end"))?;
        storages.insert(k.to_string(), std::borrow::Cow::Borrowed(data));
        pos += 8 + len;
    }
    Ok((root, storages, false))
}

// ------------------------------------------------------------------------------------------
// Values and the pickle machine.

#[derive(Debug)]
struct StorageRef {
    /// Its values' type; `Err(type name)` for one curate does not read (complex, quantised, or
    /// untyped, whose tensors name their own type).
    dtype: std::result::Result<TorchDtype, String>,
    /// Bytes per element (1 for an untyped storage).
    elem: usize,
    key: String,
    /// Legacy views: `(offset, numel)` elements into the root storage.
    view: Option<(usize, usize)>,
}

#[derive(Debug)]
struct TensorRef {
    storage: Rc<StorageRef>,
    /// Its type: its storage's, or `_rebuild_tensor_v3`'s own.
    dtype: std::result::Result<TorchDtype, String>,
    offset: usize,
    size: Vec<usize>,
    stride: Vec<usize>,
}

type Dict = Rc<RefCell<Vec<(Value, Value)>>>;

/// An object a call built: its class (when the callee was a global) and the state `BUILD` gave it.
#[derive(Debug, Default)]
struct Obj {
    class: Option<Rc<(String, String)>>,
    state: RefCell<Option<Value>>,
    /// Items `SETITEM(S)` gave it: a dict subclass's entries (`defaultdict`, `EasyDict`).
    items: RefCell<Vec<(Value, Value)>>,
}

fn object(class: Option<&Rc<(String, String)>>) -> Value {
    Value::Object(Rc::new(Obj { class: class.cloned(), ..Default::default() }))
}

#[derive(Debug, Clone)]
enum Value {
    None,
    #[allow(dead_code)]
    Bool(bool),
    Int(i128),
    // Read only by `Debug`, in error messages.
    #[allow(dead_code)]
    Float(f64),
    Str(Rc<str>),
    #[allow(dead_code)]
    Bytes(Rc<[u8]>),
    Tuple(Rc<[Value]>),
    List(Rc<RefCell<Vec<Value>>>),
    Dict(Dict),
    Global(Rc<(String, String)>),
    Storage(Rc<StorageRef>),
    Tensor(Rc<TensorRef>),
    /// Any other call's result.
    Object(Rc<Obj>),
}

struct Machine<'a> {
    b: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u64, Value>,
    /// Legacy format: each storage key's element size, from the persistent ids.
    legacy_storages: HashMap<String, usize>,
}

impl<'a> Machine<'a> {
    fn new(b: &'a [u8]) -> Self {
        Machine {
            b,
            pos: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            legacy_storages: HashMap::new(),
        }
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let s = self.b.get(self.pos..self.pos.saturating_add(n)).ok_or("the pickle ends early")?;
        self.pos += n;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> std::result::Result<u64, String> {
        let s = self.take(n)?;
        Ok(s.iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64))
    }

    fn line(&mut self) -> std::result::Result<&'a str, String> {
        let rest = &self.b[self.pos.min(self.b.len())..];
        let n = rest.iter().position(|&c| c == b'\n').ok_or("the pickle ends early")?;
        self.pos += n + 1;
        std::str::from_utf8(&rest[..n]).map_err(|_| "a text argument that is not UTF-8".to_string())
    }

    fn pop(&mut self) -> std::result::Result<Value, String> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err("a pop past a mark".into());
        }
        self.stack.pop().ok_or_else(|| "a pop from an empty stack".to_string())
    }

    fn top(&mut self) -> std::result::Result<&mut Value, String> {
        self.stack.last_mut().ok_or_else(|| "an empty stack".to_string())
    }

    fn pop_mark(&mut self) -> std::result::Result<Vec<Value>, String> {
        let m = self.marks.pop().ok_or("no mark to pop to")?;
        Ok(self.stack.split_off(m))
    }

    fn string(s: &[u8]) -> std::result::Result<Value, String> {
        std::str::from_utf8(s).map(|s| Value::Str(s.into())).map_err(|_| "a string that is not UTF-8".to_string())
    }

    /// Runs one pickle, from its first opcode to `STOP`, and returns its value.
    fn run(&mut self) -> std::result::Result<Value, String> {
        self.stack.clear();
        self.marks.clear();
        self.memo.clear();
        loop {
            let op = self.take(1)?[0];
            match op {
                0x80 => {
                    let proto = self.take(1)?[0];
                    if proto > 5 {
                        return Err(format!("pickle protocol {proto}"));
                    }
                }
                0x95 => {
                    self.take(8)?; // FRAME: a length hint
                }
                b'.' => return self.pop(),
                b'(' => self.marks.push(self.stack.len()),
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'J' => {
                    let v = self.uint(4)? as u32 as i32;
                    self.stack.push(Value::Int(v as i128));
                }
                b'K' => {
                    let v = self.uint(1)?;
                    self.stack.push(Value::Int(v as i128));
                }
                b'M' => {
                    let v = self.uint(2)?;
                    self.stack.push(Value::Int(v as i128));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a { self.uint(1)? } else { self.uint(4)? } as usize;
                    let s = self.take(n)?;
                    if n > 16 {
                        return Err("an integer wider than 128 bits".into());
                    }
                    let mut buf = [if s.last().is_some_and(|&x| x & 0x80 != 0) { 0xff } else { 0 }; 16];
                    buf[..n].copy_from_slice(s);
                    self.stack.push(Value::Int(i128::from_le_bytes(buf)));
                }
                b'I' | b'L' => {
                    let l = self.line()?.trim_end_matches('L');
                    let v = match l {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        _ => Value::Int(l.parse().map_err(|_| format!("a bad integer `{l}`"))?),
                    };
                    self.stack.push(v);
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.take(8)?.try_into().unwrap());
                    self.stack.push(Value::Float(v));
                }
                b'F' => {
                    let l = self.line()?;
                    self.stack.push(Value::Float(l.parse().map_err(|_| format!("a bad float `{l}`"))?));
                }
                b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        b'X' => self.uint(4)?,
                        0x8c => self.uint(1)?,
                        _ => self.uint(8)?,
                    } as usize;
                    let s = self.take(n)?;
                    self.stack.push(Self::string(s)?);
                }
                b'T' | b'U' => {
                    // Python 2 `str`: bytes, read as text when they are UTF-8 (keys of old checkpoints).
                    let n = if op == b'T' { self.uint(4)? } else { self.uint(1)? } as usize;
                    let s = self.take(n)?;
                    self.stack.push(Self::string(s).unwrap_or_else(|_| Value::Bytes(s.into())));
                }
                b'B' | b'C' | 0x8e => {
                    let n = match op {
                        b'B' => self.uint(4)?,
                        b'C' => self.uint(1)?,
                        _ => self.uint(8)?,
                    } as usize;
                    let s = self.take(n)?;
                    self.stack.push(Value::Bytes(s.into()));
                }
                b'V' => {
                    let l = self.line()?;
                    self.stack.push(Value::Str(l.into()));
                }
                b'S' => {
                    let l = self.line()?;
                    let t = l.trim_matches(|c| c == '\'' || c == '"');
                    self.stack.push(Value::Str(t.into()));
                }
                b')' => self.stack.push(Value::Tuple(Rc::from(Vec::new()))),
                b't' => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::Tuple(items.into()));
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n + self.marks.last().copied().unwrap_or(0) {
                        return Err("a tuple of more items than the stack holds".into());
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.stack.push(Value::Tuple(items.into()));
                }
                b']' => self.stack.push(Value::List(Default::default())),
                b'l' => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::List(Rc::new(RefCell::new(items))));
                }
                b'}' => self.stack.push(Value::Dict(Default::default())),
                b'd' => {
                    let items = self.pop_mark()?;
                    let d: Dict = Default::default();
                    Self::set_items(&d, items)?;
                    self.stack.push(Value::Dict(d));
                }
                0x8f => self.stack.push(Value::List(Default::default())), // EMPTY_SET
                b'a' => {
                    let v = self.pop()?;
                    match self.top()? {
                        Value::List(l) => l.borrow_mut().push(v),
                        _ => return Err("APPEND to something not a list".into()),
                    }
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    match self.top()? {
                        Value::List(l) => l.borrow_mut().extend(items),
                        Value::Object(_) => {} // a list subclass built by a call: its items are not tensors curate reads
                        _ => return Err("APPENDS to something not a list".into()),
                    }
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::Tuple(items.into())); // FROZENSET
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    match self.top()? {
                        Value::Dict(d) => d.borrow_mut().push((k, v)),
                        Value::Object(o) => o.items.borrow_mut().push((k, v)),
                        _ => return Err("SETITEM on something not a dict".into()),
                    }
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    match self.top()? {
                        Value::Dict(d) => {
                            let d = d.clone();
                            Self::set_items(&d, items)?
                        }
                        Value::Object(o) => {
                            let items_of = Rc::new(RefCell::new(std::mem::take(&mut *o.items.borrow_mut())));
                            Self::set_items(&items_of, items)?;
                            *o.items.borrow_mut() = items_of.take();
                        }
                        _ => return Err("SETITEMS on something not a dict".into()),
                    }
                }
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?.clone();
                    self.stack.push(v);
                }
                b'p' => {
                    let k = self.line()?.parse::<u64>().map_err(|_| "a bad memo key")?;
                    let v = self.top()?.clone();
                    self.memo.insert(k, v);
                }
                b'q' | b'r' => {
                    let k = if op == b'q' { self.uint(1)? } else { self.uint(4)? };
                    let v = self.top()?.clone();
                    self.memo.insert(k, v);
                }
                0x94 => {
                    let k = self.memo.len() as u64;
                    let v = self.top()?.clone();
                    self.memo.insert(k, v);
                }
                b'g' | b'h' | b'j' => {
                    let k = match op {
                        b'g' => self.line()?.parse::<u64>().map_err(|_| "a bad memo key")?,
                        b'h' => self.uint(1)?,
                        _ => self.uint(4)?,
                    };
                    let v = self.memo.get(&k).ok_or_else(|| format!("memo {k} read before it was written"))?.clone();
                    self.stack.push(v);
                }
                b'c' => {
                    let module = self.line()?.to_owned();
                    let name = self.line()?.to_owned();
                    self.stack.push(Value::Global(Rc::new((module, name))));
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(m), Value::Str(n)) => {
                            self.stack.push(Value::Global(Rc::new((m.to_string(), n.to_string()))))
                        }
                        _ => return Err("STACK_GLOBAL of something not two strings".into()),
                    }
                }
                b'R' => {
                    let args = self.pop()?;
                    let f = self.pop()?;
                    let v = self.call(&f, &args, 0)?;
                    self.stack.push(v);
                }
                0x81 => {
                    let _args = self.pop()?;
                    let cls = self.pop()?;
                    let v = match &cls {
                        Value::Global(g) if is_dict_class(g) => Value::Dict(Default::default()),
                        Value::Global(g) => object(Some(g)),
                        _ => object(None),
                    };
                    self.stack.push(v);
                }
                0x92 => {
                    let _kwargs = self.pop()?;
                    let _args = self.pop()?;
                    let v = match self.pop()? {
                        Value::Global(g) => object(Some(&g)),
                        _ => object(None),
                    };
                    self.stack.push(v);
                }
                b'b' => {
                    let state = self.pop()?;
                    if let Value::Object(o) = self.top()? {
                        *o.state.borrow_mut() = Some(state);
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let s = self.persistent(&pid)?;
                    self.stack.push(s);
                }
                b'P' => return Err("a text persistent id (protocol 0), which torch does not write".into()),
                other => return Err(format!("pickle opcode 0x{other:02x} at byte {}", self.pos - 1)),
            }
        }
    }

    fn set_items(d: &Dict, items: Vec<Value>) -> std::result::Result<(), String> {
        if !items.len().is_multiple_of(2) {
            return Err("SETITEMS of an odd number of items".into());
        }
        let mut d = d.borrow_mut();
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            d.push((k, v));
        }
        Ok(())
    }

    /// `('storage', torch.XStorage, key, location, numel[, view])`.
    fn persistent(&mut self, pid: &Value) -> std::result::Result<Value, String> {
        let Value::Tuple(t) = pid else { return Err(format!("a persistent id of {}", kind(pid))) };
        match (t.first(), t.get(1), t.get(2)) {
            (Some(Value::Str(tag)), Some(Value::Global(g)), Some(Value::Str(key))) if &**tag == "storage" => {
                let (dtype, elem) = match TorchDtype::from_storage(&g.1) {
                    Some(d) => (Ok(d), d.size()),
                    None => match other_storage_size(&g.1) {
                        Some(e) => (Err(g.1.trim_end_matches("Storage").to_owned()), e),
                        None => return Err(format!("storage type `{}.{}`", g.0, g.1)),
                    },
                };
                self.legacy_storages.insert(key.to_string(), elem);
                let view = match t.get(5) {
                    Some(Value::Tuple(v)) => match (v.get(1), v.get(2)) {
                        (Some(Value::Int(o)), Some(Value::Int(n))) => {
                            match (usize::try_from(*o), usize::try_from(*n)) {
                                (Ok(o), Ok(n)) => Some((o, n)),
                                _ => return Err("a storage view at a negative or huge offset".into()),
                            }
                        }
                        _ => return Err("a storage view without offset and size".into()),
                    },
                    _ => None,
                };
                Ok(Value::Storage(Rc::new(StorageRef { dtype, elem, key: key.to_string(), view })))
            }
            // A legacy `torch.save(model)` refers to each module class so (with its source).
            (Some(Value::Str(tag)), Some(class @ Value::Global(_)), _) if &**tag == "module" => Ok(class.clone()),
            _ => Err(format!("a persistent id that is not a storage ({} items)", t.len())),
        }
    }

    fn call(&mut self, f: &Value, args: &Value, depth: usize) -> std::result::Result<Value, String> {
        let Value::Global(g) = f else { return Ok(object(None)) };
        if depth > 8 {
            return Err("tensor rebuilds nested deeper than torch writes them".into());
        }
        let args: &[Value] = match args {
            Value::Tuple(t) => t,
            _ => &[],
        };
        let (module, name) = (g.0.as_str(), g.1.as_str());
        Ok(match (module, name) {
            _ if is_dict_class(g) => {
                let d: Dict = Default::default();
                if let Some(Value::List(items)) = args.first() {
                    for item in items.borrow().iter() {
                        if let Value::Tuple(kv) = item {
                            if let [k, v] = &kv[..] {
                                d.borrow_mut().push((k.clone(), v.clone()));
                            }
                        }
                    }
                }
                Value::Dict(d)
            }
            ("builtins" | "__builtin__", "set" | "frozenset") => match args.first() {
                Some(Value::List(items)) => Value::List(Rc::new(RefCell::new(items.borrow().clone()))),
                _ => Value::List(Default::default()),
            },
            ("torch._utils", "_rebuild_tensor" | "_rebuild_tensor_v2") => tensor(args, None)?,
            ("torch._utils", "_rebuild_tensor_v3") => match args.get(6) {
                Some(Value::Global(d)) => tensor(args, Some(&d.1))?,
                _ => return Err("`_rebuild_tensor_v3` without its dtype".into()),
            },
            ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
                args.first().cloned().ok_or("a parameter without its tensor")?
            }
            ("torch._tensor", "_rebuild_from_type_v2") => match (args.first(), args.get(2)) {
                (Some(f), Some(a)) => self.call(f, a, depth + 1)?,
                _ => return Err("`_rebuild_from_type_v2` without its function and arguments".into()),
            },
            ("torch._utils", other) if other.starts_with("_rebuild") => {
                return Err(format!("`torch._utils.{other}` (a sparse, quantised or otherwise special tensor)"))
            }
            _ => object(Some(g)),
        })
    }
}

/// What a value is, in a word or two, for messages (never its whole contents).
fn kind(v: &Value) -> String {
    match v {
        Value::Int(i) => format!("the integer {i}"),
        Value::Str(s) if s.len() <= 40 => format!("the string `{s}`"),
        Value::Tuple(t) => format!("a tuple of {}", t.len()),
        Value::Global(g) => format!("`{}.{}`", g.0, g.1),
        Value::None => "None".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Float(_) => "a float".into(),
        Value::Str(_) => "a long string".into(),
        Value::Bytes(_) => "bytes".into(),
        Value::List(_) => "a list".into(),
        Value::Dict(_) => "a dict".into(),
        Value::Storage(_) => "a storage".into(),
        Value::Tensor(_) => "a tensor".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn is_dict_class(g: &(String, String)) -> bool {
    matches!((g.0.as_str(), g.1.as_str()), ("collections", "OrderedDict") | ("builtins" | "__builtin__", "dict"))
}

/// `_rebuild_tensor_v2(storage, storage_offset, size, stride, ...)`, or v3's with `dtype`, the
/// tensor's own type over an untyped storage (offsets count its elements).
fn tensor(args: &[Value], dtype: Option<&str>) -> std::result::Result<Value, String> {
    let ints = |v: Option<&Value>| -> std::result::Result<Vec<usize>, String> {
        match v {
            Some(Value::Tuple(t)) => t
                .iter()
                .map(|x| match x {
                    Value::Int(i) => usize::try_from(*i)
                        .map_err(|_| "a tensor size or stride that is not a non-negative integer".to_string()),
                    _ => Err("a tensor size or stride that is not a non-negative integer".to_string()),
                })
                .collect(),
            _ => Err("a tensor without its size or stride".into()),
        }
    };
    let Some(Value::Storage(storage)) = args.first() else { return Err("a tensor without its storage".into()) };
    let offset = match args.get(1) {
        Some(Value::Int(o)) => usize::try_from(*o).map_err(|_| "a negative or huge storage offset".to_string())?,
        _ => return Err("a tensor without its storage offset".into()),
    };
    let (size, stride) = (ints(args.get(2))?, ints(args.get(3))?);
    if size.len() != stride.len() {
        return Err("a tensor whose size and stride differ in length".into());
    }
    let dtype = match dtype {
        None => storage.dtype.clone(),
        Some(name) => TorchDtype::from_name(name).ok_or_else(|| name.to_owned()),
    };
    Ok(Value::Tensor(Rc::new(TensorRef { storage: storage.clone(), dtype, offset, size, stride })))
}

// ------------------------------------------------------------------------------------------
// Finding the tensors.

/// Tensors by name, in the order found.
type Found = Vec<(String, Rc<TensorRef>)>;

/// Finds the tensors of a checkpoint's object under their state-dict names.
struct Finder {
    declared: Declared,
    /// Members looked at so far: shared references can make a small file a huge tree.
    visits: std::cell::Cell<usize>,
}

/// How many members [`Finder`] looks at, at most.
const MAX_VISITS: usize = 5_000_000;

impl Finder {
    /// The tensors of `root` by name (see the module documentation), and the entry they came
    /// from: a dict holding tensors is the state dict unless one of its entries holds more than
    /// it holds directly (a training checkpoint keeping its best accuracy as a 0-dim tensor
    /// beside its `state_dict`).
    fn choose(&self, root: &Value) -> std::result::Result<(Found, Option<String>), String> {
        let mut node = root.clone();
        let mut path: Vec<String> = Vec::new();
        while let Value::Dict(d) = &node {
            let entries: Vec<(String, Value)> = d
                .borrow()
                .iter()
                .filter_map(|(k, v)| match k {
                    Value::Str(k) => Some((k.to_string(), v.clone())),
                    _ => None,
                })
                .collect();
            let direct = entries.iter().filter(|(_, v)| matches!(v, Value::Tensor(_))).count();
            let counts: Vec<usize> =
                entries.iter().map(|(_, v)| if matches!(v, Value::Tensor(_)) { 0 } else { self.count(v, 0) }).collect();
            self.check_budget()?;
            let most = counts.iter().copied().max().unwrap_or(0);
            if most == 0 || most <= direct {
                break;
            }
            let mut best: Vec<&str> =
                entries.iter().zip(&counts).filter(|(_, &c)| c == most).map(|((k, _), _)| k.as_str()).collect();
            // The weights' moving average beside the trained ones: the publishers' loaders read
            // the average whenever it holds tensors, whatever either holds (mobile-vision's model
            // zoo `model_ema`, timm's `state_dict_ema`).
            let holds = |name: &str| entries.iter().zip(&counts).any(|((k, _), &c)| k == name && c > direct);
            if holds("state_dict") {
                if let Some(ema) = ["model_ema", "state_dict_ema"].into_iter().find(|k| holds(k)) {
                    best = vec![ema];
                }
            }
            if best.len() > 1 {
                return Err(format!(
                    "its entries {} hold as many tensors ({most} each), and curate will not guess which is the model \
                     (save the one to load on its own: `torch.save(ckpt[\"{}\"], ...)`)",
                    best.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
                    best[0]
                ));
            }
            let i = entries.iter().position(|(k, _)| k == best[0]).expect("a most");
            path.push(entries[i].0.clone());
            node = entries[i].1.clone();
        }
        let mut out = Vec::new();
        self.collect(&node, "", &mut out, 0);
        self.check_budget()?;
        Ok((out, (!path.is_empty()).then(|| path.join("."))))
    }

    fn check_budget(&self) -> std::result::Result<(), String> {
        if self.visits.get() > MAX_VISITS {
            return Err(format!(
                "its objects refer to one another more than {MAX_VISITS} times over (shared references nested deep)"
            ));
        }
        Ok(())
    }

    /// The named members of `v` that may hold tensors: a dict's string-keyed entries; a
    /// module's parameters, persistent buffers and submodules (`torch.save(model)`, as its
    /// `state_dict()` lists them); a TorchScript object's declared parameters and buffers and
    /// its other attributes (submodules); any other object's state and items (a dict subclass).
    /// An optimizer's state (`state` beside `param_groups`) holds no weights and gives none.
    fn children(&self, v: &Value) -> Vec<(String, Value)> {
        let n = self.visits.get() + 1;
        self.visits.set(n);
        if n > MAX_VISITS {
            return Vec::new();
        }
        let entries = |d: &[(Value, Value)]| -> Vec<(String, Value)> {
            d.iter()
                .filter_map(|(k, v)| match k {
                    Value::Str(k) => Some((k.to_string(), v.clone())),
                    _ => None,
                })
                .collect()
        };
        let optimizer =
            |e: &[(String, Value)]| e.iter().any(|(k, _)| k == "state") && e.iter().any(|(k, _)| k == "param_groups");
        let o = match v {
            Value::Dict(d) => {
                let e = entries(&d.borrow());
                return if optimizer(&e) { Vec::new() } else { e };
            }
            Value::Object(o) => o,
            _ => return Vec::new(),
        };
        let mut attrs = match &*o.state.borrow() {
            Some(Value::Dict(d)) => entries(&d.borrow()),
            // `(state, slots)` from `__reduce_ex__`.
            Some(Value::Tuple(t)) => match t.first() {
                Some(Value::Dict(d)) => entries(&d.borrow()),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        attrs.extend(entries(&o.items.borrow()));
        if optimizer(&attrs) {
            return Vec::new();
        }
        let class = o.class.as_ref().map(|g| format!("{}.{}", g.0, g.1));
        if let Some(names) = class.and_then(|c| self.declared.get(&c)) {
            return attrs.into_iter().filter(|(k, v)| !matches!(v, Value::Tensor(_)) || names.contains(k)).collect();
        }
        let get = |key: &str| attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let Some(params) = get("_parameters") else { return attrs };
        // An eager `nn.Module`.
        let non_persistent: Vec<String> = match get("_non_persistent_buffers_set") {
            Some(Value::List(l)) => l
                .borrow()
                .iter()
                .filter_map(|v| match v {
                    Value::Str(s) => Some(s.to_string()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut out = self.children(&params);
        if let Some(buffers) = get("_buffers") {
            out.extend(self.children(&buffers).into_iter().filter(|(k, _)| !non_persistent.contains(k)));
        }
        if let Some(modules) = get("_modules") {
            out.extend(self.children(&modules));
        }
        out
    }

    fn count(&self, v: &Value, depth: usize) -> usize {
        if depth > 64 || self.visits.get() > MAX_VISITS {
            return 0;
        }
        match v {
            Value::Tensor(_) => 1,
            _ => self.children(v).iter().map(|(_, c)| self.count(c, depth + 1)).sum(),
        }
    }

    fn collect(&self, v: &Value, prefix: &str, out: &mut Vec<(String, Rc<TensorRef>)>, depth: usize) {
        if depth > 64 || self.visits.get() > MAX_VISITS {
            return;
        }
        for (k, c) in self.children(v) {
            let name = if prefix.is_empty() { k } else { format!("{prefix}.{k}") };
            match &c {
                Value::Tensor(t) => out.push((name, t.clone())),
                Value::Dict(_) | Value::Object(_) => self.collect(&c, &name, out, depth + 1),
                _ => {}
            }
        }
    }
}

/// Tensors larger than their storage (expanded views, stride 0) are copied up to this size; a
/// larger one is kept aside as unreadable, failing a load only if a model asks for it.
const MAX_EXPANDED_BYTES: usize = 1 << 30;

/// The elements of `t` in row-major order, little-endian; a tensor of a type curate does not
/// read comes back without bytes.
fn materialise(t: &TensorRef, storages: &Storages<'_>, big_endian: bool) -> std::result::Result<TorchTensor, String> {
    let s = &t.storage;
    let aside = |type_name: String| TorchTensor { dtype: None, type_name, shape: t.size.clone(), bytes: Vec::new() };
    let dtype = match &t.dtype {
        Ok(d) => *d,
        Err(name) => return Ok(aside(name.clone())),
    };
    let raw = storages.get(&s.key).ok_or_else(|| format!("its storage `{}` is not in the file", s.key))?;
    let raw: &[u8] = match s.view {
        Some((o, n)) => o
            .checked_add(n)
            .and_then(|end| Some((o.checked_mul(s.elem)?, end.checked_mul(s.elem)?)))
            .and_then(|(a, b)| raw.get(a..b))
            .ok_or("a storage view past its root")?,
        None => raw,
    };
    let es = dtype.size();
    let numel_storage = raw.len() / es;
    let numel = t.size.iter().try_fold(1usize, |a, &n| a.checked_mul(n)).ok_or("a size past the address space")?;
    let mut bytes = Vec::new();
    if numel > 0 {
        // Checked before anything of the tensor's size is allocated.
        let last = t
            .size
            .iter()
            .zip(&t.stride)
            .try_fold(t.offset, |a, (&n, &s)| (n - 1).checked_mul(s).and_then(|x| a.checked_add(x)))
            .unwrap_or(usize::MAX);
        if last >= numel_storage {
            return Err(format!(
                "it reaches element {last} of a storage of {numel_storage} (size {:?}, stride {:?}, offset {})",
                t.size, t.stride, t.offset
            ));
        }
        // Within its storage's bounds, only an expanded view (stride 0) can be larger than it.
        let len = numel.saturating_mul(es);
        if numel > numel_storage && len > MAX_EXPANDED_BYTES {
            return Ok(aside(format!(
                "{} expanded to {numel} elements from a storage of {numel_storage}, too large to copy",
                dtype.name()
            )));
        }
        bytes.try_reserve_exact(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
        let contiguous = t
            .size
            .iter()
            .zip(&t.stride)
            .rev()
            .try_fold(1usize, |want, (&n, &s)| (n == 1 || s == want).then_some(want * n))
            .is_some();
        if contiguous {
            bytes.extend_from_slice(&raw[t.offset * es..(t.offset + numel) * es]);
        } else {
            let mut idx = vec![0usize; t.size.len()];
            for _ in 0..numel {
                let e = t.offset + idx.iter().zip(&t.stride).map(|(i, s)| i * s).sum::<usize>();
                bytes.extend_from_slice(&raw[e * es..(e + 1) * es]);
                for d in (0..idx.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < t.size[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }
    }
    if big_endian && es > 1 {
        bytes.chunks_exact_mut(es).for_each(|c| c.reverse());
    }
    Ok(TorchTensor { dtype: Some(dtype), type_name: dtype.name().to_owned(), shape: t.size.clone(), bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/torch").join(name)
    }

    /// The values of `t` as f64, decoded by type.
    fn values(t: &TorchTensor) -> Vec<f64> {
        let b = &t.bytes;
        match t.dtype.expect("a readable tensor") {
            TorchDtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            TorchDtype::F64 => b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
            TorchDtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            TorchDtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            TorchDtype::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            TorchDtype::Bool | TorchDtype::U8 => b.iter().map(|&x| x as f64).collect(),
            other => panic!("no fixture of {other:?}"),
        }
    }

    #[test]
    fn every_fixture_reads_as_torch_wrote_it() {
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap();
        let files = expected["files"].as_object().unwrap();
        assert!(files.len() >= 6);
        for (file, want) in files {
            let head = std::fs::read(fixture(file)).unwrap();
            assert!(looks_like_torch(&head[..64]), "{file}");
            if let Some(error) = want["error"].as_str() {
                let e = read(&fixture(file)).err().unwrap_or_else(|| panic!("{file}: read")).to_string();
                assert!(e.contains(error), "{file}: {e}");
                continue;
            }
            let c = read(&fixture(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(c.entry.as_deref(), want["entry"].as_str(), "{file}");
            assert_eq!(c.stripped_module, file.ends_with(".pth.tar"), "{file}");
            let unreadable = want["unreadable"].as_object().cloned().unwrap_or_default();
            for (name, type_name) in &unreadable {
                let t = &c.tensors.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{file} {name}")).1;
                assert!(t.dtype.is_none() && t.bytes.is_empty(), "{file} {name}");
                assert!(t.type_name.contains(type_name.as_str().unwrap()), "{file} {name}: {}", t.type_name);
            }
            let want = want["tensors"].as_object().unwrap();
            let mut names: Vec<&str> =
                c.tensors.iter().map(|(n, _)| n.as_str()).filter(|n| !unreadable.contains_key(*n)).collect();
            names.sort_unstable();
            let mut want_names: Vec<&str> = want.keys().map(|k| k.as_str()).collect();
            want_names.sort_unstable();
            assert_eq!(names, want_names, "{file}");
            for (name, t) in c.tensors.iter().filter(|(n, _)| !unreadable.contains_key(n)) {
                let w = &want[name];
                assert_eq!(t.dtype.map(TorchDtype::name), w["dtype"].as_str(), "{file} {name}");
                let shape: Vec<usize> =
                    w["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                assert_eq!(t.shape, shape, "{file} {name}");
                let wv: Vec<f64> = w["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
                // serde_json reads decimals to within an ulp of f64; any misread element of a
                // float32 or smaller type is off by far more.
                let got = values(t);
                assert_eq!(got.len(), wv.len(), "{file} {name}");
                for (g, w) in got.iter().zip(&wv) {
                    assert!((g - w).abs() <= 1e-15 * w.abs(), "{file} {name}: {got:?} vs {wv:?}");
                }
            }
        }
    }

    #[test]
    fn state_dicts_keep_their_order() {
        let c = read(&fixture("special.pt")).unwrap();
        let names: Vec<&str> = c.tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[..3], ["f32", "f16_transposed", "bf16"]);
        assert_eq!(names.last(), Some(&"mask"));
    }

    #[test]
    fn damaged_files_are_refused_with_a_reason() {
        let good = std::fs::read(fixture("special.pt")).unwrap();
        // Cut short: no end-of-central-directory record.
        let e = parse(&good[..good.len() / 2]).unwrap_err();
        assert!(e.contains("end-of-central-directory"), "{e}");
        let legacy = std::fs::read(fixture("special_legacy.pt")).unwrap();
        let e = parse(&legacy[..legacy.len() - 1]).unwrap_err();
        assert!(e.contains("runs past the end"), "{e}");
        assert!(parse(b"\x80\x02K\x05.").unwrap_err().contains("magic number"));
        // A pickle that is not a state dict: nothing to read.
        let e = parse(
            &[
                b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.".as_slice(),
                b"\x80\x02M\xe9\x03.",
                b"\x80\x02}.",
                b"\x80\x02}.",
                b"\x80\x02].".as_slice(),
            ]
            .concat(),
        )
        .unwrap_err();
        assert!(e.contains("holds no tensors"), "{e}");
        // Lengths and sizes as large as their fields hold: errors, not overflows.
        let e = Machine::new(b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff.").run().unwrap_err();
        assert!(e.contains("ends early"), "{e}");
        let mut m = Machine::new(&legacy);
        for _ in 0..5 {
            m.run().unwrap();
        }
        let mut huge = legacy.clone();
        huge[m.pos..m.pos + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = parse(&huge).unwrap_err();
        assert!(e.contains("overflows") || e.contains("runs past the end"), "{e}");
        // An opcode curate does not run is named with its place.
        let e = Machine::new(b"\x80\x02\xff.").run().unwrap_err();
        assert!(e.contains("0xff at byte 2"), "{e}");
    }

    #[test]
    fn no_damage_makes_the_reader_panic() {
        // Every truncation and every single-byte change of two fixtures: an error or a value,
        // never a panic (an index out of range, an overflow, an allocation of what a size
        // field claims).
        for file in ["special_legacy.pt", "special.pt"] {
            let good = std::fs::read(fixture(file)).unwrap();
            for cut in 0..good.len() {
                let _ = parse(&good[..cut]);
            }
            for i in 0..good.len() {
                for x in [0x00, 0xff, good[i] ^ 0x01, good[i].wrapping_add(0x40)] {
                    let mut bad = good.clone();
                    bad[i] = x;
                    let _ = parse(&bad);
                }
            }
        }
    }

    #[test]
    fn a_legacy_file_is_little_endian_whatever_its_header_says() {
        // torch writes legacy storages little-endian on every machine and ignores the header's
        // `little_endian` on reading: a file from a big-endian machine reads as any other.
        let good = std::fs::read(fixture("special_legacy.pt")).unwrap();
        let at = good.windows(13).position(|w| w == b"little_endian").expect("the system facts");
        let flag = good[at..].iter().position(|&b| b == 0x88).expect("NEWTRUE") + at;
        let mut big = good.clone();
        big[flag] = 0x89; // NEWFALSE
        let (a, b) = (parse(&good).unwrap(), parse(&big).unwrap());
        assert_eq!(a.tensors.len(), b.tensors.len());
        for ((n, x), (_, y)) in a.tensors.iter().zip(&b.tensors) {
            assert_eq!(x.bytes, y.bytes, "{n}");
        }
    }

    #[test]
    fn shared_references_nested_deep_are_refused_not_walked() {
        // 40 levels, each a dict whose two entries are the level below: 2^40 paths in 40 dicts.
        let mut root = b"\x80\x02}q\x00".to_vec();
        for i in 1..=40u8 {
            root.extend_from_slice(b"}(X\x01\x00\x00\x00ah");
            root.push(i - 1);
            root.extend_from_slice(b"X\x01\x00\x00\x00bh");
            root.push(i - 1);
            root.extend_from_slice(b"uq");
            root.push(i);
        }
        root.push(b'.');
        let magic = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.";
        let file = [magic.as_slice(), b"\x80\x02M\xe9\x03.", b"\x80\x02}.", &root, b"\x80\x02]."].concat();
        let started = std::time::Instant::now();
        let e = parse(&file).unwrap_err();
        assert!(e.contains("refer to one another"), "{e}");
        assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    }

    #[test]
    fn a_view_past_its_storage_is_refused() {
        let storage = Rc::new(StorageRef { dtype: Ok(TorchDtype::F32), elem: 4, key: "0".into(), view: None });
        let t = TensorRef { storage, dtype: Ok(TorchDtype::F32), offset: 2, size: vec![2, 2], stride: vec![2, 1] };
        let raw = [0u8; 20]; // 5 floats; the view reaches element 5
        let storages: Storages = [("0".to_string(), std::borrow::Cow::Borrowed(&raw[..]))].into_iter().collect();
        let e = materialise(&t, &storages, false).unwrap_err();
        assert!(e.contains("reaches element 5 of a storage of 5"), "{e}");
        let ok = TensorRef { offset: 1, ..t };
        assert_eq!(materialise(&ok, &storages, false).unwrap().bytes.len(), 16);
    }

    #[test]
    fn a_big_endian_zip_is_swapped() {
        let storage = Rc::new(StorageRef { dtype: Ok(TorchDtype::F32), elem: 4, key: "0".into(), view: None });
        let t = TensorRef { storage, dtype: Ok(TorchDtype::F32), offset: 0, size: vec![1], stride: vec![1] };
        let raw = 1.5f32.to_be_bytes();
        let storages: Storages = [("0".to_string(), std::borrow::Cow::Borrowed(&raw[..]))].into_iter().collect();
        assert_eq!(materialise(&t, &storages, true).unwrap().bytes, 1.5f32.to_le_bytes());
    }
}
