//! Which version of `multicluster.x-k8s.io` an API server is read and written in: v1beta1
//! where it is served (mcs-api v0.5.0's CRDs serve both), else v1alpha1 (CRDs of before).
//! The watch of an MCS kind asks the API server's discovery when it starts and again
//! after each list refused with 404, so CRDs installed or replaced later are read in the
//! version they serve; what it found is what the MCS writer writes in
//! ([`super::ApiClient::mcs_version`]).

use futures::{Stream, StreamExt};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::Api;

use super::status::is_not_found;
use super::ApiClient;
use crate::model::McsVersion;
use crate::source::manifest::MCS_GROUP;

/// The API resource of an MCS kind (`ServiceExport`, `ServiceImport`) in `version`.
pub fn resource(kind: &str, version: McsVersion) -> ApiResource {
    ApiResource {
        group: MCS_GROUP.into(),
        version: version.name().into(),
        api_version: format!("{MCS_GROUP}/{}", version.name()),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

/// The version of the MCS group `versions` (a discovery answer's) has that kpx prefers.
pub fn preferred<'a>(versions: impl IntoIterator<Item = &'a str>) -> Option<McsVersion> {
    versions.into_iter().filter_map(McsVersion::named).max_by_key(|v| *v == McsVersion::V1Beta1)
}

/// What the API server serves of the MCS group; `None` when it serves none of it, or
/// discovery failed (the list that follows says which).
async fn served(api: &ApiClient) -> Option<McsVersion> {
    let groups = api.kube().list_api_groups().await.ok()?;
    let group = groups.groups.iter().find(|g| g.name == MCS_GROUP)?;
    preferred(group.versions.iter().map(|v| v.version.as_str()))
}

/// Whether a watch item is a list refused with 404: the kind is not served (in this version).
fn unserved(item: &Result<Event<DynamicObject>, watcher::Error>) -> bool {
    matches!(item, Err(watcher::Error::InitialListFailed(kube::Error::Api(status))) if is_not_found(status))
}

/// The watch of MCS kind `kind`, in the version discovery finds (v1beta1 when it finds
/// none), started over in the version found then after each list refused with 404.
pub fn watch(
    api: ApiClient,
    kind: &'static str,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<DynamicObject>, watcher::Error>> + Send {
    futures::stream::unfold(api, move |api| {
        let config = config.clone();
        async move {
            let version = match served(&api).await {
                Some(version) => {
                    api.set_mcs_version(version);
                    version
                }
                None => McsVersion::V1Beta1,
            };
            let objects = Api::<DynamicObject>::all_with(api.kube().clone(), &resource(kind, version));
            // Until (and with) the first 404: then discovery is asked again.
            let epoch = watcher::watcher(objects, config).scan(false, |ended, item| {
                let next = if *ended {
                    None
                } else {
                    *ended = unserved(&item);
                    Some(item)
                };
                futures::future::ready(next)
            });
            Some((epoch, api))
        }
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1beta1_is_preferred_and_v1alpha1_read_where_it_is_all_there_is() {
        assert_eq!(preferred(["v1alpha1", "v1beta1"]), Some(McsVersion::V1Beta1));
        assert_eq!(preferred(["v1beta1", "v1alpha1"]), Some(McsVersion::V1Beta1));
        assert_eq!(preferred(["v1alpha1"]), Some(McsVersion::V1Alpha1));
        assert_eq!(preferred(["v2"]), None);
        assert_eq!(
            resource("ServiceImport", McsVersion::V1Alpha1).api_version,
            "multicluster.x-k8s.io/v1alpha1"
        );
        assert_eq!(resource("ServiceExport", McsVersion::V1Beta1).plural, "serviceexports");
    }
}
