//! What the session tells the proxy of its models: the catalog read again in the background and
//! advertised when it changed (or the proxy asked), and the models' states at once when a
//! backend unloaded one or loaded it again.

use tokio::sync::mpsc;

use super::{mapped_models, send, sent, Next, Refreshed, Session, Socket};
use crate::protocol::{ModelsUpdateMessage, WorkerToServer};
use crate::worker::catalog::{self, Catalog};
use crate::worker::report;

impl Session<'_> {
    /// A re-read catalog: advertised when it changed, or always when the proxy asked for it
    /// (`models_refresh` is answered with `models_update`, as the wire traces show).
    pub(super) async fn on_catalog(&mut self, socket: &mut Socket, refreshed: Refreshed) -> Next {
        let changed = refreshed.catalog != self.catalog;
        if self.draining || !(changed || refreshed.requested) {
            return Next::Continue;
        }
        let models = refreshed.catalog.models();
        if models != self.catalog.models() {
            tracing::info!(?models, "backend models changed");
        }
        self.catalog = refreshed.catalog;
        let update = self.models_update(Some(models), None);
        sent(send(socket, &update).await)
    }

    /// A backend unloaded a model or loaded one again ([`crate::worker::resting`]): the proxy
    /// hears it now, in a `models_update` with the same models, rather than at the next ping.
    pub(super) async fn on_states_changed(&mut self, socket: &mut Socket) -> Next {
        let update = self.models_update(Some(self.catalog.models()), None);
        sent(send(socket, &update).await)
    }

    /// Re-reads the catalog in the background; `requested` marks a refresh the proxy asked for.
    pub(super) fn spawn_refresh(&self, catalog_tx: &mpsc::Sender<Refreshed>, requested: bool) {
        let (config, access) = (self.config.clone(), self.access.clone());
        let mapped = mapped_models(self.lifecycle);
        let catalog_tx = catalog_tx.clone();
        tokio::spawn(async move {
            let catalog = catalog::load(&config, &access, mapped).await;
            let _ = catalog_tx.send(Refreshed { catalog, requested }).await;
        });
    }

    /// A `models_update`: `models` with what the catalog knows of them, or none (draining,
    /// going to sleep).
    pub(super) fn models_update(
        &self,
        models: Option<Vec<String>>,
        going_to_sleep: Option<bool>,
    ) -> WorkerToServer {
        let catalog = models.is_some().then_some(&self.catalog);
        let states = || report::model_states(self.lifecycle, &self.access.resting);
        WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            model_states: catalog.and_then(|_| states()),
            warm_ups: catalog.and_then(Catalog::warm_ups),
            sides_first: catalog.and_then(Catalog::sides_first),
            models: models.unwrap_or_default(),
            current_load: self.active.len() as u32,
            going_to_sleep,
            context_windows: catalog.and_then(Catalog::context_windows),
        })
    }
}
