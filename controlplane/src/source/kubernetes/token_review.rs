//! Node identity from a ServiceAccount token: a TokenReview on each cluster's API server.

use kube::Api;

use super::ApiClient;

/// The node a ServiceAccount token is bound to, by a TokenReview on each cluster's API
/// server in turn (a node's token is its own cluster's): the review's `extra` carries
/// `authentication.kubernetes.io/node-name` for tokens bound to a pod (Kubernetes ≥ 1.30).
pub struct TokenReviews {
    clients: Vec<(String, ApiClient)>,
}

impl TokenReviews {
    pub fn new(clients: Vec<(String, ApiClient)>) -> Self {
        TokenReviews { clients }
    }
}

/// The `extra` key of a pod-bound token's node.
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

#[tonic::async_trait]
impl crate::trust::TokenReviewer for TokenReviews {
    async fn node_of(&self, token: &str, audience: &str) -> Result<String, String> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        let mut reasons = Vec::new();
        for (cluster, api) in &self.clients {
            let client = api.kube();
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_owned()),
                    audiences: Some(vec![audience.to_owned()]),
                },
                ..Default::default()
            };
            let api: Api<TokenReview> = Api::all(client.clone());
            let answer = match api.create(&kube::api::PostParams::default(), &review).await {
                Ok(answer) => answer,
                Err(e) => {
                    reasons.push(format!("{cluster}: TokenReview failed: {e}"));
                    continue;
                }
            };
            let status = answer.status.unwrap_or_default();
            if status.authenticated != Some(true) {
                let why =
                    status.error.filter(|e| !e.is_empty()).unwrap_or_else(|| "not authenticated".into());
                reasons.push(format!("{cluster}: {why}"));
                continue;
            }
            if !status.audiences.as_deref().unwrap_or_default().iter().any(|a| a == audience) {
                reasons.push(format!("{cluster}: not bound to the audience {audience:?}"));
                continue;
            }
            let user = status.user.unwrap_or_default();
            let node = user.extra.as_ref().and_then(|e| e.get(NODE_NAME_EXTRA)).and_then(|v| v.first());
            return match node {
                Some(node) if !node.is_empty() => Ok(node.clone()),
                _ => Err(format!(
                    "{cluster}: {} is not bound to a pod on a node (no {NODE_NAME_EXTRA})",
                    user.username.unwrap_or_default()
                )),
            };
        }
        if reasons.is_empty() {
            reasons.push("no Kubernetes source to review it".into());
        }
        Err(reasons.join("; "))
    }
}
