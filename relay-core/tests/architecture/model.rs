//! The crate as the rules see it, read the way the compiler reads it: from `lib.rs` down its
//! `mod` declarations (`#[path]` included), each file parsed by `syn`. Every path in code is
//! seen — `use` trees with their groups and renames, `crate::`, `super::` and `self::` paths in
//! expressions and types, and paths inside macro invocations — and resolved to the module it
//! names. Test code (`#[cfg(test)]`) is marked, so rules about what runs can leave it out.

use std::collections::BTreeMap;
use std::path::Path;

use syn::visit::Visit;

/// One module of the crate: `proxy::scheduler::turns`; the crate root is `""`.
pub type ModulePath = String;

/// Where a path was named.
#[derive(Debug, Clone)]
pub struct Reference {
    /// The module naming it.
    pub from: ModulePath,
    /// Its file, under `src/`.
    pub file: String,
    /// The path, absolute: within the crate without the leading `crate`, otherwise as the
    /// external crate names it (`tokio::spawn`, after expanding `use` renames and imports).
    pub path: Vec<String>,
    /// Whether it points into this crate.
    pub internal: bool,
    /// Inside test code.
    pub test: bool,
}

/// The crate's modules and every path its code names.
#[derive(Debug, Default, Clone)]
pub struct CrateModel {
    /// Each module and its file (inline modules share their parent's file).
    pub modules: BTreeMap<ModulePath, String>,
    pub references: Vec<Reference>,
}

impl CrateModel {
    /// The crate under `src`, from `lib.rs`.
    pub fn read(src: &Path) -> CrateModel {
        let mut model = CrateModel::default();
        let mut pending = vec![(src.join("lib.rs"), String::new(), false)];
        while let Some((file, module, test)) = pending.pop() {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let relative = file
                .strip_prefix(src)
                .unwrap_or(&file)
                .to_string_lossy()
                .replace('\\', "/");
            for (candidates, child, child_test) in model.add_file(&relative, &module, test, &text) {
                let file = candidates
                    .iter()
                    .map(|candidate| src.join(candidate))
                    .find(|file| file.is_file())
                    .unwrap_or_else(|| panic!("module {child}: none of {candidates:?}"));
                pending.push((file, child, child_test));
            }
        }
        model
    }

    /// Adds one file's code as `module`; returns the modules it declares (where each one's
    /// file may be, the module, whether it is test code).
    pub fn add_file(
        &mut self,
        file: &str,
        module: &str,
        test: bool,
        text: &str,
    ) -> Vec<(Vec<String>, ModulePath, bool)> {
        let syntax = syn::parse_file(text).unwrap_or_else(|e| panic!("{file}: {e}"));
        self.modules.insert(module.to_string(), file.to_string());
        let mut reader = FileReader {
            file: file.to_string(),
            scopes: vec![Scope {
                module: module.to_string(),
                test,
                names: BTreeMap::new(),
            }],
            declared: Vec::new(),
            references: Vec::new(),
            inline: Vec::new(),
        };
        reader.collect_names(&syntax.items);
        reader.visit_file(&syntax);
        for inline in reader.inline {
            self.modules.insert(inline, file.to_string());
        }
        self.references.extend(reader.references);
        reader.declared
    }

    /// The module of this crate an internal path names: its longest prefix that is a module.
    pub fn module_of(&self, path: &[String]) -> ModulePath {
        for len in (0..=path.len()).rev() {
            let candidate = path[..len].join("::");
            if self.modules.contains_key(&candidate) {
                return candidate;
            }
        }
        String::new()
    }
}

/// Whether `module` is `unit` or inside it.
pub fn within(module: &str, unit: &str) -> bool {
    unit.is_empty()
        || module == unit
        || (module.starts_with(unit) && module[unit.len()..].starts_with("::"))
}

/// A module being read: its path, whether it is test code, and the names its `use` items bring
/// in (name → absolute path).
struct Scope {
    module: ModulePath,
    test: bool,
    names: BTreeMap<String, (Vec<String>, bool)>,
}

struct FileReader {
    file: String,
    scopes: Vec<Scope>,
    /// `mod x;` declarations: (where its file may be, under src/, in the compiler's order;
    /// module; test).
    declared: Vec<(Vec<String>, ModulePath, bool)>,
    references: Vec<Reference>,
    inline: Vec<ModulePath>,
}

fn is_test_attribute(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let text = quote_attr(attr);
        text.starts_with("cfg(") && text.contains("test") && !text.contains("not(test")
            || text == "test"
            || text.starts_with("tokio::test")
    })
}

/// An attribute as text without spaces (`cfg(test)`, `path="x.rs"`).
fn quote_attr(attr: &syn::Attribute) -> String {
    let path: Vec<String> = attr
        .path()
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    let rest = match &attr.meta {
        syn::Meta::Path(_) => String::new(),
        syn::Meta::List(list) => format!("({})", list.tokens),
        syn::Meta::NameValue(nv) => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => format!("={:?}", s.value()),
            _ => "=?".to_string(),
        },
    };
    format!("{}{}", path.join("::"), rest).replace(' ', "")
}

impl FileReader {
    fn scope(&self) -> &Scope {
        self.scopes.last().expect("a scope")
    }

    /// Collects the names `use` items bring into the current scope (before any code is read,
    /// as a `use` anywhere in a module applies to all of it).
    fn collect_names(&mut self, items: &[syn::Item]) {
        for item in items {
            if let syn::Item::Use(item_use) = item {
                let mut found = Vec::new();
                expand_use(&item_use.tree, Vec::new(), &mut found);
                for (segments, alias) in found {
                    let Some(alias) = alias else { continue };
                    if let Some(resolved) = self.resolve(&segments) {
                        self.scopes
                            .last_mut()
                            .unwrap()
                            .names
                            .insert(alias, resolved);
                    }
                }
            }
        }
    }

    /// The absolute form of `segments` named in the current scope, and whether it is internal;
    /// `None` for a path that names nothing outside the scope (a local or a prelude item).
    fn resolve(&self, segments: &[String]) -> Option<(Vec<String>, bool)> {
        let first = segments.first()?;
        let module: Vec<String> = if self.scope().module.is_empty() {
            Vec::new()
        } else {
            self.scope()
                .module
                .split("::")
                .map(str::to_string)
                .collect()
        };
        match first.as_str() {
            "crate" => Some((segments[1..].to_vec(), true)),
            "self" => {
                let mut path = module;
                path.extend_from_slice(&segments[1..]);
                Some((path, true))
            }
            "super" => {
                let mut path = module;
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    path.pop();
                    rest = &rest[1..];
                }
                path.extend_from_slice(rest);
                Some((path, true))
            }
            _ => {
                // A name a `use` brought in, in this scope or an enclosing one.
                for scope in self.scopes.iter().rev() {
                    if let Some((target, internal)) = scope.names.get(first) {
                        let mut path = target.clone();
                        path.extend_from_slice(&segments[1..]);
                        return Some((path, *internal));
                    }
                }
                // An external crate named in full (`tokio::spawn`, `std::env::var`).
                (segments.len() > 1).then(|| (segments.to_vec(), false))
            }
        }
    }

    fn record(&mut self, segments: &[String]) {
        if let Some((path, internal)) = self.resolve(segments) {
            let scope = self.scope();
            self.references.push(Reference {
                from: scope.module.clone(),
                file: self.file.clone(),
                path,
                internal,
                test: scope.test,
            });
        }
    }

    /// Paths inside a macro's tokens (`format!`, `tracing::info!`, `tokio::select!`): read as
    /// text, `a :: b :: c` sequences.
    fn record_macro_tokens(&mut self, tokens: &proc_macro2_text::Tokens) {
        for path in tokens.paths() {
            self.record(&path);
        }
    }
}

/// Flattens a `use` tree into (path, name it brings in); a glob brings no single name.
fn expand_use(
    tree: &syn::UseTree,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(path) => {
            let mut next = prefix;
            next.push(path.ident.to_string());
            expand_use(&path.tree, next, out);
        }
        syn::UseTree::Name(name) => {
            let ident = name.ident.to_string();
            if ident == "self" {
                let alias = prefix.last().cloned();
                out.push((prefix, alias));
            } else {
                let mut path = prefix;
                path.push(ident.clone());
                out.push((path, Some(ident)));
            }
        }
        syn::UseTree::Rename(rename) => {
            let mut path = prefix;
            let ident = rename.ident.to_string();
            if ident != "self" {
                path.push(ident);
            }
            out.push((path, Some(rename.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix, None)),
        syn::UseTree::Group(group) => {
            for item in &group.items {
                expand_use(item, prefix.clone(), out);
            }
        }
    }
}

impl<'ast> Visit<'ast> for FileReader {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        let test = self.scope().test || is_test_attribute(&item.attrs);
        let name = item.ident.to_string();
        let module = if self.scope().module.is_empty() {
            name.clone()
        } else {
            format!("{}::{name}", self.scope().module)
        };
        match &item.content {
            Some((_, items)) => {
                self.inline.push(module.clone());
                self.scopes.push(Scope {
                    module,
                    test,
                    names: BTreeMap::new(),
                });
                self.collect_names(items);
                for item in items {
                    self.visit_item(item);
                }
                self.scopes.pop();
            }
            None => {
                let explicit = item.attrs.iter().find_map(|attr| {
                    let text = quote_attr(attr);
                    text.strip_prefix("path=")
                        .map(|p| p.trim_matches('"').to_string())
                });
                let here = Path::new(&self.file);
                let dir = here.parent().unwrap_or(Path::new(""));
                let candidates = match explicit {
                    Some(path) => vec![dir.join(path)],
                    None => {
                        let base = match here.file_name().and_then(|f| f.to_str()) {
                            Some("lib.rs") | Some("mod.rs") => dir.to_path_buf(),
                            _ => here.with_extension(""),
                        };
                        vec![
                            base.join(format!("{name}.rs")),
                            base.join(&name).join("mod.rs"),
                        ]
                    }
                };
                let candidates = candidates
                    .iter()
                    .map(|file| file.to_string_lossy().replace('\\', "/"))
                    .collect();
                self.declared.push((candidates, module, test));
            }
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let test = is_test_attribute(&item.attrs);
        let mut found = Vec::new();
        expand_use(&item.tree, Vec::new(), &mut found);
        let was = self.scopes.last().unwrap().test;
        self.scopes.last_mut().unwrap().test |= test;
        for (segments, _) in found {
            self.record(&segments);
        }
        self.scopes.last_mut().unwrap().test = was;
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        self.in_test_if(&item.attrs, |this| syn::visit::visit_item_fn(this, item));
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        self.in_test_if(&item.attrs, |this| syn::visit::visit_item_impl(this, item));
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        self.in_test_if(&item.attrs, |this| {
            syn::visit::visit_impl_item_fn(this, item)
        });
    }

    fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
        self.in_test_if(&item.attrs, |this| {
            syn::visit::visit_item_struct(this, item)
        });
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let tokens = proc_macro2_text::Tokens::of(&mac.tokens.to_string());
        self.record_macro_tokens(&tokens);
        syn::visit::visit_macro(self, mac);
    }
}

impl FileReader {
    fn in_test_if(&mut self, attrs: &[syn::Attribute], visit: impl FnOnce(&mut Self)) {
        let test = is_test_attribute(attrs);
        let was = self.scopes.last().unwrap().test;
        self.scopes.last_mut().unwrap().test |= test;
        visit(self);
        self.scopes.last_mut().unwrap().test = was;
    }
}

/// Reading paths out of a macro's tokens, which `syn` leaves unparsed.
mod proc_macro2_text {
    /// A macro's tokens as text (`proc_macro2` prints `a :: b`).
    pub struct Tokens(String);

    impl Tokens {
        pub fn of(text: &str) -> Tokens {
            Tokens(text.to_string())
        }

        /// Every `a::b[::c…]` sequence of identifiers (string literals left out).
        pub fn paths(&self) -> Vec<Vec<String>> {
            let mut words: Vec<String> = Vec::new();
            let mut chars = self.0.chars().peekable();
            let mut current = String::new();
            while let Some(c) = chars.next() {
                if c == '"' {
                    // Skip a string literal (escapes included).
                    let mut escaped = false;
                    for c in chars.by_ref() {
                        if escaped {
                            escaped = false;
                        } else if c == '\\' {
                            escaped = true;
                        } else if c == '"' {
                            break;
                        }
                    }
                    if !current.is_empty() {
                        words.push(std::mem::take(&mut current));
                    }
                    words.push("\"".into());
                    continue;
                }
                if c.is_alphanumeric() || c == '_' {
                    current.push(c);
                } else {
                    if !current.is_empty() {
                        words.push(std::mem::take(&mut current));
                    }
                    if c == ':' && chars.peek() == Some(&':') {
                        chars.next();
                        words.push("::".into());
                    } else if !c.is_whitespace() {
                        words.push(c.to_string());
                    }
                }
            }
            if !current.is_empty() {
                words.push(current);
            }
            let is_ident = |w: &str| {
                w.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
            };
            let mut paths = Vec::new();
            let mut i = 0;
            while i < words.len() {
                if is_ident(&words[i]) && words.get(i + 1).is_some_and(|w| w == "::") {
                    let mut path = vec![words[i].clone()];
                    let mut j = i + 1;
                    while words.get(j).is_some_and(|w| w == "::")
                        && words.get(j + 1).is_some_and(|w| is_ident(w))
                    {
                        path.push(words[j + 1].clone());
                        j += 2;
                    }
                    // A path only starts after something that is not `::`.
                    if i == 0 || words[i - 1] != "::" {
                        paths.push(path);
                    }
                    i = j;
                } else {
                    i += 1;
                }
            }
            paths
        }
    }
}

/// Every module path and file under `src/` a rule may name must exist in `model`.
pub fn names_exist(model: &CrateModel, name: &str) -> bool {
    if name.ends_with(".rs") {
        model.modules.values().any(|file| file == name)
    } else {
        model.modules.contains_key(name)
    }
}

/// All the crate's modules sharing a first segment.
pub fn top_level(module: &str) -> &str {
    module.split("::").next().unwrap_or_default()
}
