//! Layering invariants of ARCHITECTURE.md, checked on the source text of `src/` (no GPU):
//!
//! - the crate's modules form layers, and no file names a module of a higher layer;
//! - the pure layers (everything below the device) never name wgpu and deny `unsafe` code;
//! - no two files import each other, directly or through others.
//!
//! The import graph is read from `use` declarations and `crate::` / `super::` paths in code
//! (comments, `#[cfg(test)]` items and the `pub use` faces of `lib.rs` and `mod.rs` files aside);
//! a path is resolved to the file that defines the named item, through re-exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crate's top-level modules, bottom up, and whether each is pure (wgpu-free). A file may name
/// items of its own layer and of the layers below it, never of a layer above.
const LAYERS: &[(&str, bool)] = &[
    ("rng", true),
    ("buddy", true),
    ("policy", true),
    ("history", true),
    ("snapshot", true),
    ("state", true),
    ("replay", true),
    ("plan", true),
    ("model", true),
    ("paging", true),
    ("scheduler", true),
    ("device", false),
    ("pool", false),
    ("report", false),
    ("compute", false),
    ("serve", false),
];

/// One source file of the crate.
struct SourceFile {
    /// Its path relative to the crate root, e.g. `src/compute/context.rs`.
    path: String,
    /// Its module path, e.g. `["compute", "context"]` (`[]` for `lib.rs`).
    module: Vec<String>,
    /// Its code: comments, string literals and `#[cfg(test)]` items blanked.
    code: String,
    /// True for `lib.rs` and `mod.rs`: their `pub use` declarations are the module's face.
    face: bool,
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// Comments and string literals replaced by spaces (line structure kept).
fn strip_comments_and_strings(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(text.len(), |n| i + n);
            out.extend(std::iter::repeat_n(' ', end - i));
            i = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(text.len(), |n| i + n + 2);
            out.extend(
                text[i..end]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            i = end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let open = if rest.starts_with("r#\"") { 3 } else { 2 };
            let close = if open == 3 { "\"#" } else { "\"" };
            let end = rest[open..]
                .find(close)
                .map_or(text.len(), |n| i + open + n + close.len());
            out.extend(
                text[i..end]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            i = end;
        } else if rest.starts_with('"') {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(bytes.len());
            out.extend(
                text[i..end]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            i = end;
        } else if rest.starts_with("'\"'") {
            out.push_str("   ");
            i += 3;
        } else {
            let c = rest.chars().next().expect("not at the end");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `#[cfg(test)]` items (a `mod tests;` line or a braced block) blanked.
fn strip_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let mut depth = 0i64;
        let mut opened = false;
        for item_line in lines.by_ref() {
            depth += item_line.matches('{').count() as i64;
            depth -= item_line.matches('}').count() as i64;
            opened |= item_line.contains('{');
            if (opened && depth <= 0) || (!opened && item_line.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    out
}

fn read_sources(root: &Path) -> Vec<SourceFile> {
    let mut paths = Vec::new();
    rust_files(&root.join("src"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let mut module: Vec<String> = relative
                .trim_start_matches("src/")
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_owned)
                .collect();
            let face = matches!(module.last().map(String::as_str), Some("mod" | "lib"));
            if face {
                module.pop();
            }
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            SourceFile {
                path: relative,
                module,
                code: strip_test_items(&strip_comments_and_strings(&text)),
                face,
            }
        })
        .collect()
}

/// The `use` declarations of a file: (is `pub`, the text between `use` and `;`).
fn use_declarations(code: &str) -> Vec<(bool, String)> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let before = rest[..at].trim_end();
        let is_pub = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let start_of_statement = before.is_empty()
            || before.ends_with(';')
            || before.ends_with('{')
            || before.ends_with('}')
            || before.ends_with(']')
            || is_pub;
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        if start_of_statement {
            found.push((is_pub, after[..end].trim().to_owned()));
        }
        rest = &after[end..];
    }
    found
}

/// The byte index of `word` in `text` as a whole identifier.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(found) = text[from..].find(word) {
        let at = from + found;
        let before_ok = text[..at].chars().next_back().is_none_or(|c| !ident(c));
        let after_ok = text[at + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !ident(c));
        if before_ok && after_ok {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The paths a use tree names (`a::{b, c::{d, e}}` gives `a::b`, `a::c::d`, `a::c::e`); `self`
/// names the prefix, `*` is kept as a segment.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    fn parse(text: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let text = text.trim();
        if let Some(open) = text.find('{') {
            let head: Vec<String> = text[..open]
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let mut base = prefix.to_vec();
            base.extend(head);
            let inner = &text[open + 1..text.rfind('}').unwrap_or(text.len())];
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parse(&inner[start..i], &base, out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            parse(&inner[start..], &base, out);
        } else if !text.is_empty() {
            let text = text.split(" as ").next().unwrap_or(text).trim();
            let mut path = prefix.to_vec();
            for segment in text.split("::").map(str::trim) {
                if segment != "self" {
                    path.push(segment.to_owned());
                }
            }
            out.push(path);
        }
    }
    let mut out = Vec::new();
    parse(tree, &[], &mut out);
    out
}

/// Paths written in code outside `use` declarations: `crate::a::b` and `super::a`.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for start_word in ["crate", "super"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(start_word) {
            let at = from + found;
            from = at + start_word.len();
            if code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| ident(c) || c == ':')
                || !code[from..].starts_with("::")
            {
                continue;
            }
            let mut path = vec![start_word.to_owned()];
            let mut rest = &code[from..];
            while let Some(after) = rest.strip_prefix("::") {
                let len = after.find(|c: char| !ident(c)).unwrap_or(after.len());
                if len == 0 {
                    break;
                }
                path.push(after[..len].to_owned());
                rest = &after[len..];
            }
            out.push(path);
        }
    }
    out
}

/// Names that a file defines (structs, enums, functions, traits, types, consts, statics, inline
/// modules, macros).
fn definitions(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '!'))
        .filter(|w| !w.is_empty())
        .collect();
    for pair in words.windows(2) {
        if matches!(
            pair[0],
            "struct"
                | "enum"
                | "fn"
                | "trait"
                | "type"
                | "const"
                | "static"
                | "mod"
                | "union"
                | "macro_rules!"
        ) {
            names.insert(pair[1].to_owned());
        }
    }
    names
}

struct Crate {
    files: Vec<SourceFile>,
    /// Module path -> index of its file.
    modules: BTreeMap<Vec<String>, usize>,
    definitions: Vec<BTreeSet<String>>,
    /// Per file: re-exported name -> the absolute path it names.
    reexports: Vec<BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn read(root: &Path) -> Self {
        let files = read_sources(root);
        let modules = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        let definitions = files.iter().map(|f| definitions(&f.code)).collect();
        let mut krate = Self {
            files,
            modules,
            definitions,
            reexports: Vec::new(),
        };
        krate.reexports = (0..krate.files.len())
            .map(|i| {
                let mut map = BTreeMap::new();
                for (is_pub, tree) in use_declarations(&krate.files[i].code) {
                    if !is_pub {
                        continue;
                    }
                    for path in use_paths(&tree) {
                        if let Some(absolute) = krate.absolute(i, &path) {
                            if let Some(name) = absolute.last().filter(|n| *n != "*") {
                                map.insert(name.clone(), absolute);
                            }
                        }
                    }
                }
                map
            })
            .collect();
        krate
    }

    /// `path` as written in file `file`, made absolute (`None` for other crates' paths).
    fn absolute(&self, file: usize, path: &[String]) -> Option<Vec<String>> {
        let here = &self.files[file].module;
        let first = path.first()?;
        let (mut base, rest) = match first.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (here.clone(), &path[1..]),
            "super" => {
                let mut base = here.clone();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                (base, rest)
            }
            child => {
                let mut candidate = here.clone();
                candidate.push(child.to_owned());
                if !self.modules.contains_key(&candidate) {
                    return None;
                }
                (here.clone(), path)
            }
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file that defines what the absolute `path` names, following re-exports.
    fn resolve(&self, path: &[String], depth: usize) -> Option<usize> {
        let mut module: Vec<String> = Vec::new();
        let mut file = *self.modules.get(&module)?;
        for (i, segment) in path.iter().enumerate() {
            let mut deeper = module.clone();
            deeper.push(segment.clone());
            if let Some(&child) = self.modules.get(&deeper) {
                module = deeper;
                file = child;
                continue;
            }
            if segment == "*" || self.definitions[file].contains(segment) || depth > 8 {
                return Some(file);
            }
            if let Some(target) = self.reexports[file].get(segment) {
                let mut followed = target.clone();
                followed.extend(path[i + 1..].iter().cloned());
                return self.resolve(&followed, depth + 1).or(Some(file));
            }
            return Some(file);
        }
        Some(file)
    }

    /// The import graph: for each file, the files it names and the first path naming each.
    fn imports(&self) -> Vec<BTreeMap<usize, String>> {
        (0..self.files.len())
            .map(|i| {
                let file = &self.files[i];
                let mut paths = Vec::new();
                let mut code = file.code.clone();
                for (is_pub, tree) in use_declarations(&file.code) {
                    // Blank the declaration so that its paths are not read again as inline paths.
                    code = code.replacen(&tree, &" ".repeat(tree.len()), 1);
                    if is_pub && file.face {
                        continue;
                    }
                    paths.extend(use_paths(&tree));
                }
                paths.extend(inline_paths(&code));
                let mut targets = BTreeMap::new();
                for path in paths {
                    let Some(absolute) = self.absolute(i, &path) else {
                        continue;
                    };
                    if let Some(target) = self.resolve(&absolute, 0) {
                        if target != i {
                            targets.entry(target).or_insert_with(|| path.join("::"));
                        }
                    }
                }
                targets
            })
            .collect()
    }
}

fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn layer_of(file: &SourceFile) -> Option<usize> {
    let top = file.module.first()?;
    LAYERS.iter().position(|(name, _)| name == top)
}

#[test]
fn every_module_has_a_layer() {
    let krate = Crate::read(&crate_root());
    for file in &krate.files {
        if file.module.is_empty() {
            continue;
        }
        assert!(
            layer_of(file).is_some(),
            "{}: module `{}` is in no layer of tests/it/layering.rs (and ARCHITECTURE.md)",
            file.path,
            file.module[0]
        );
    }
}

#[test]
fn no_file_names_a_higher_layer() {
    let krate = Crate::read(&crate_root());
    let imports = krate.imports();
    let mut edges = 0;
    for (i, targets) in imports.iter().enumerate() {
        let Some(from) = layer_of(&krate.files[i]) else {
            continue;
        };
        for (&target, path) in targets {
            edges += 1;
            if let Some(to) = layer_of(&krate.files[target]) {
                assert!(
                    to <= from,
                    "{} (layer `{}`) names `{path}` in {} (layer `{}`, above it)",
                    krate.files[i].path,
                    LAYERS[from].0,
                    krate.files[target].path,
                    LAYERS[to].0
                );
            }
        }
    }
    assert!(
        edges > 20,
        "expected to read the crate's imports, read {edges}"
    );
}

#[test]
fn the_pure_layers_know_nothing_of_wgpu_and_deny_unsafe_code() {
    let krate = Crate::read(&crate_root());
    let mut checked = 0;
    for file in &krate.files {
        let Some(layer) = layer_of(file) else {
            continue;
        };
        if !LAYERS[layer].1 {
            continue;
        }
        for (number, line) in file.code.lines().enumerate() {
            assert!(
                find_word(line, "wgpu").is_none(),
                "{}:{}: the pure layer `{}` must not use wgpu: {line}",
                file.path,
                number + 1,
                LAYERS[layer].0
            );
        }
        if file.module.len() == 1 {
            assert!(
                file.code.contains("#![deny(unsafe_code)]"),
                "{}: a pure module denies unsafe code (#![deny(unsafe_code)])",
                file.path
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 10,
        "expected to check the pure modules' files, checked {checked}"
    );
}

/// A circle in the import graph, as the files on it (the first repeated at the end), if any.
fn find_circle(imports: &[BTreeMap<usize, String>]) -> Option<Vec<usize>> {
    // Depth-first search with colours: a grey file reached again closes a circle.
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        White,
        Grey,
        Black,
    }
    fn visit(
        file: usize,
        imports: &[BTreeMap<usize, String>],
        colour: &mut [Colour],
        stack: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        colour[file] = Colour::Grey;
        stack.push(file);
        for &next in imports[file].keys() {
            match colour[next] {
                Colour::Grey => {
                    let start = stack.iter().position(|&f| f == next).expect("on the stack");
                    let mut circle = stack[start..].to_vec();
                    circle.push(next);
                    return Some(circle);
                }
                Colour::White => {
                    if let Some(circle) = visit(next, imports, colour, stack) {
                        return Some(circle);
                    }
                }
                Colour::Black => {}
            }
        }
        stack.pop();
        colour[file] = Colour::Black;
        None
    }
    let mut colour = vec![Colour::White; imports.len()];
    (0..imports.len()).find_map(|file| {
        (colour[file] == Colour::White)
            .then(|| visit(file, imports, &mut colour, &mut Vec::new()))
            .flatten()
    })
}

#[test]
fn no_two_files_import_each_other() {
    let krate = Crate::read(&crate_root());
    let imports = krate.imports();
    if let Some(circle) = find_circle(&imports) {
        let steps: Vec<String> = circle
            .windows(2)
            .map(|pair| {
                format!(
                    "{} -> {} ({})",
                    krate.files[pair[0]].path,
                    krate.files[pair[1]].path,
                    imports[pair[0]][&pair[1]]
                )
            })
            .collect();
        panic!(
            "files import each other in a circle:\n  {}",
            steps.join("\n  ")
        );
    }
}

#[test]
fn the_import_reader_sees_a_circle_and_a_re_export() {
    // The checks above are only as good as the reader: a re-exported name resolves to the file
    // that defines it, and a `super::` import inside a module file is an import of its parent.
    assert_eq!(
        use_paths("super::{kernels::{A, B as C}, D, self}"),
        vec![
            vec!["super", "kernels", "A"],
            vec!["super", "kernels", "B"],
            vec!["super", "D"],
            vec!["super"],
        ]
    );
    assert_eq!(
        inline_paths("let x = crate::report::pytorch_snapshot(&s); super::f();"),
        vec![
            vec!["crate", "report", "pytorch_snapshot"],
            vec!["super", "f"]
        ]
    );
    let code = strip_test_items(&strip_comments_and_strings(
        "use a::b; // use c::d;\n\"use e::f;\"\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    ));
    assert_eq!(use_declarations(&code), vec![(false, "a::b".to_owned())]);
    let graph = |edges: &[(usize, usize)]| {
        let mut imports = vec![BTreeMap::new(); 4];
        for &(from, to) in edges {
            imports[from].insert(to, String::new());
        }
        imports
    };
    assert_eq!(
        find_circle(&graph(&[(0, 1), (1, 2), (2, 3), (3, 1)])),
        Some(vec![1, 2, 3, 1])
    );
    assert_eq!(find_circle(&graph(&[(0, 1), (1, 2), (0, 2), (2, 3)])), None);
    let krate = Crate::read(&crate_root());
    let pool = krate.modules[&vec!["pool".to_owned()]];
    let lib = krate.modules[&Vec::new()];
    let resolved = krate.resolve(&["Pool".to_owned()], 0);
    assert_eq!(
        resolved,
        Some(pool),
        "crate::Pool resolves through lib.rs to the pool"
    );
    assert_ne!(resolved, Some(lib));
}
