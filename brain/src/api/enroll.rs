//! Enrolment: a one-time join token and a CSR become a worker's certificate. The only call
//! that needs no client certificate; the token is checked before any signature is made.

use std::collections::BTreeMap;

use proto::enrollment_server::Enrollment;
use proto::{EnrollRequest, EnrollResponse};
use shared::pki::{self, Role};
use tonic::{Request, Response, Status};

use super::{Services, check_name, convert};
use crate::trust::registry::WorkerRecord;

#[tonic::async_trait]
impl Enrollment for Services {
    async fn enroll(
        &self,
        req: Request<EnrollRequest>,
    ) -> Result<Response<EnrollResponse>, Status> {
        let req = req.into_inner();
        check_name(&req.name)?;
        convert::labels(&req.labels)?;
        // Cheap checks first: an unknown token costs no signature.
        self.0.registry.check_token(&req.token).await?;
        let worker_id = format!("w-{}", hex::encode(rand::random::<[u8; 6]>()));
        // Sign before consuming the token, so a malformed request does not burn it.
        let cert_pem = self
            .0
            .ca
            .sign_client(&req.csr_der, Role::Worker, &worker_id)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let token_labels = self.0.registry.consume_token(&req.token).await?;
        let cert_der = pki::certs_from_pem(&cert_pem, std::path::Path::new("issued"))
            .map_err(|e| Status::internal(e.to_string()))?
            .remove(0);
        // Labels from the token were chosen by an admin and win over the worker's own.
        let mut labels: BTreeMap<String, String> = req.labels.into_iter().collect();
        labels.extend(token_labels);
        let rec = WorkerRecord {
            v: 1,
            id: worker_id.clone(),
            name: req.name.clone(),
            labels,
            cert_fingerprint: pki::fingerprint(&cert_der),
            enrolled_ms: shared::now_unix_ms(),
            last_seen_ms: 0,
            revoked: false,
            caps: None,
            removed: false,
        };
        self.0.registry.add_worker(&rec).await?;
        tracing::info!(worker = %worker_id, name = %req.name, "worker enrolled");
        Ok(Response::new(EnrollResponse {
            worker_id,
            cert_pem,
            ca_pem: self.0.ca.cert_pem.clone(),
        }))
    }
}
