//! The TypeScript types of the HTTP API the web UI reads, generated from the Rust types that
//! serialize it (ts-rs) into `ui/src/api.generated.ts`, which is checked in. The test here fails
//! when that file is stale, as the test command does for `ui/dist`; write it again with
//! `MODELRELAY_WRITE_TS=1 cargo test -p relay-core --lib typescript`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ts_rs::{Config, TypeVisitor, TS};

use crate::node::api::{
    DiscoveryAnswer, JoinCodeAnswer, JoinRequest, JoinTestAnswer, SettingsAnswer, StartOnLoginState,
};
use crate::node::join_code::JoinDetails;
use crate::proxy::observation::control::status::Status;
use crate::store::keys::{KeyView, NewKey};
use crate::store::usage::UsageReport;

/// The generated file, from `relay-core/`.
const GENERATED: &str = "../ui/src/api.generated.ts";

/// Collects declarations by name (a file's declarations may come in any order in TypeScript;
/// by name, the file reads the same whatever order the compiler visits them in).
struct Declarations<'c> {
    config: &'c Config,
    out: BTreeMap<String, String>,
}

impl TypeVisitor for Declarations<'_> {
    fn visit<T: TS + 'static + ?Sized>(&mut self) {
        if T::output_path().is_none() {
            // A wrapper or a primitive: what it holds may still be declared.
            T::visit_generics(self);
            T::visit_dependencies(self);
            return;
        }
        let name = T::ident(self.config);
        if self.out.contains_key(&name) {
            return;
        }
        self.out.insert(name.clone(), String::new());
        T::visit_dependencies(self);
        self.out
            .insert(name, format!("export {}", T::decl(self.config)));
    }
}

/// The whole generated file.
fn generated() -> String {
    // Integers are JSON numbers the UI reads as `number` (ids, counts, Unix milliseconds: all
    // far below 2^53).
    let config = Config::new().with_large_int("number");
    let mut declarations = Declarations {
        config: &config,
        out: BTreeMap::new(),
    };
    declarations.visit::<Status>();
    declarations.visit::<DiscoveryAnswer>();
    declarations.visit::<SettingsAnswer>();
    declarations.visit::<StartOnLoginState>();
    declarations.visit::<JoinCodeAnswer>();
    declarations.visit::<JoinTestAnswer>();
    declarations.visit::<JoinRequest>();
    declarations.visit::<JoinDetails>();
    declarations.visit::<KeyView>();
    declarations.visit::<NewKey>();
    declarations.visit::<UsageReport>();
    let mut file = String::from(
        "// Generated from the relay's Rust types by relay-core/src/typescript.rs: do not edit.\n\
         // Write it again with `MODELRELAY_WRITE_TS=1 cargo test -p relay-core --lib typescript`.\n",
    );
    for declaration in declarations.out.into_values() {
        file.push('\n');
        file.push_str(declaration.trim_end());
        file.push('\n');
    }
    file
}

#[test]
fn the_ui_types_are_generated_from_the_rust_types() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(GENERATED);
    let wanted = generated();
    if std::env::var_os("MODELRELAY_WRITE_TS").is_some() {
        std::fs::write(&path, &wanted).expect("write the generated types");
        return;
    }
    let found = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        found == wanted,
        "{} is stale: the Rust types of the HTTP API changed. Write it again with \
         `MODELRELAY_WRITE_TS=1 cargo test -p relay-core --lib typescript`, then fix what the UI's \
         type check finds (npm run build in ui/).",
        path.display()
    );
}
