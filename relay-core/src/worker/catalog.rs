//! Which backend serves which model: built from `MODELS` or from the backends' own model lists,
//! and rebuilt at each refresh so models that appear or vanish change what the worker advertises.

use futures_util::future::join_all;

use super::{Backends, WorkerConfig};
use crate::discovery::{discover, fetch_models};

/// Models and the backend base URL that serves each, in advertisement order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    routes: Vec<(String, String)>,
    /// Where requests for models nobody listed go (the first backend).
    fallback: Option<String>,
}

impl Catalog {
    /// The advertised model names.
    pub fn models(&self) -> Vec<String> {
        self.routes.iter().map(|(model, _)| model.clone()).collect()
    }

    /// The backend for `model`: its own, or the first backend.
    pub fn backend_for(&self, model: &str) -> Option<&str> {
        self.routes
            .iter()
            .find(|(m, _)| m == model)
            .map(|(_, backend)| backend.as_str())
            .or(self.fallback.as_deref())
    }

    fn add(&mut self, model: String, backend: &str) {
        if !self.routes.iter().any(|(m, _)| *m == model) {
            self.routes.push((model, backend.to_string()));
        }
    }
}

/// Reads the current catalog. A backend that cannot be listed contributes no models (it is down
/// or not ready), and the reason is logged once per refresh.
pub async fn load(config: &WorkerConfig, client: &reqwest::Client) -> Catalog {
    let mut catalog = Catalog::default();
    let backends: Vec<(String, Option<Vec<String>>)> = match &config.backends {
        Backends::Fixed(urls) => urls.iter().map(|u| (u.clone(), None)).collect(),
        Backends::Discover(options) => discover(options)
            .await
            .into_iter()
            .map(|found| (found.url, Some(found.models)))
            .collect(),
    };
    catalog.fallback = backends.first().map(|(url, _)| url.clone());
    if let Some(models) = &config.models {
        if let Some(first) = &catalog.fallback.clone() {
            for model in models {
                catalog.add(model.clone(), first);
            }
        }
        return catalog;
    }
    let listed = join_all(backends.iter().map(|(url, known)| async move {
        match known {
            Some(models) => Ok(models.clone()),
            None => fetch_models(client, url).await,
        }
    }))
    .await;
    for ((url, _), models) in backends.iter().zip(listed) {
        match models {
            Ok(models) => {
                for model in models {
                    catalog.add(model, url);
                }
            }
            Err(error) => tracing::warn!("backend error: could not list models: {error}"),
        }
    }
    catalog
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_backend_listing_a_model_serves_it_and_others_fall_back() {
        let mut catalog = Catalog {
            fallback: Some("http://a".to_string()),
            ..Catalog::default()
        };
        catalog.add("m1".to_string(), "http://a");
        catalog.add("m2".to_string(), "http://b");
        catalog.add("m1".to_string(), "http://b");
        assert_eq!(catalog.models(), vec!["m1", "m2"]);
        assert_eq!(catalog.backend_for("m2"), Some("http://b"));
        assert_eq!(catalog.backend_for("m1"), Some("http://a"));
        assert_eq!(catalog.backend_for("other"), Some("http://a"));
    }
}
