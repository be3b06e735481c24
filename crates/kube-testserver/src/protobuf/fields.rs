//! The field table of every protobuf message the server speaks: each k8s-pb message with the JSON
//! name of each of its fields, as kube-apiserver's JSON names them.
//!
//! Listed once from k8s-pb's messages and k8s-openapi's JSON names. The compiler keeps it whole:
//! decoding builds each message with a struct literal naming every field, so a field that a
//! newer k8s-pb adds is a build error here, never a field silently dropped. `as inline` marks the
//! structs Go embeds (their fields sit at the parent's level in JSON); `as bytes` and
//! `as bytes_map` the byte fields, base64 in JSON.

use super::json::{Json, bytes_map, inline};

super::json::messages! {
    k8s_pb::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "apiVersion",
        kind: "kind",
        name: "name",
        uid: "uid",
        controller: "controller",
        block_owner_deletion: "blockOwnerDeletion",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
        manager: "manager",
        operation: "operation",
        api_version: "apiVersion",
        time: "time",
        fields_type: "fieldsType",
        fields_v1: "fieldsV1",
        subresource: "subresource",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: "name",
        generate_name: "generateName",
        namespace: "namespace",
        self_link: "selfLink",
        uid: "uid",
        resource_version: "resourceVersion",
        generation: "generation",
        creation_timestamp: "creationTimestamp",
        deletion_timestamp: "deletionTimestamp",
        deletion_grace_period_seconds: "deletionGracePeriodSeconds",
        labels: "labels",
        annotations: "annotations",
        owner_references: "ownerReferences",
        finalizers: "finalizers",
        managed_fields: "managedFields",
    }
    k8s_pb::api::core::v1::NamespaceSpec {
        finalizers: "finalizers",
    }
    k8s_pb::api::core::v1::NamespaceCondition {
        r#type: "type",
        status: "status",
        last_transition_time: "lastTransitionTime",
        reason: "reason",
        message: "message",
    }
    k8s_pb::api::core::v1::NamespaceStatus {
        phase: "phase",
        conditions: "conditions",
    }
    k8s_pb::api::core::v1::Namespace {
        metadata: "metadata",
        spec: "spec",
        status: "status",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::ListMeta {
        self_link: "selfLink",
        resource_version: "resourceVersion",
        r#continue: "continue",
        remaining_item_count: "remainingItemCount",
    }
    k8s_pb::api::core::v1::NamespaceList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::core::v1::Secret {
        metadata: "metadata",
        immutable: "immutable",
        data: "data" as bytes_map,
        string_data: "stringData",
        r#type: "type",
    }
    k8s_pb::api::core::v1::SecretList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::core::v1::ConfigMap {
        metadata: "metadata",
        immutable: "immutable",
        data: "data",
        binary_data: "binaryData" as bytes_map,
    }
    k8s_pb::api::core::v1::ConfigMapList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::core::v1::ObjectReference {
        kind: "kind",
        namespace: "namespace",
        name: "name",
        uid: "uid",
        api_version: "apiVersion",
        resource_version: "resourceVersion",
        field_path: "fieldPath",
    }
    k8s_pb::api::core::v1::LocalObjectReference {
        name: "name",
    }
    k8s_pb::api::core::v1::ServiceAccount {
        metadata: "metadata",
        secrets: "secrets",
        image_pull_secrets: "imagePullSecrets",
        automount_service_account_token: "automountServiceAccountToken",
    }
    k8s_pb::api::core::v1::ServiceAccountList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::core::v1::ServicePort {
        name: "name",
        protocol: "protocol",
        app_protocol: "appProtocol",
        port: "port",
        target_port: "targetPort",
        node_port: "nodePort",
    }
    k8s_pb::api::core::v1::ClientIpConfig {
        timeout_seconds: "timeoutSeconds",
    }
    k8s_pb::api::core::v1::SessionAffinityConfig {
        client_ip: "clientIP",
    }
    k8s_pb::api::core::v1::ServiceSpec {
        ports: "ports",
        selector: "selector",
        cluster_ip: "clusterIP",
        cluster_ips: "clusterIPs",
        r#type: "type",
        external_ips: "externalIPs",
        session_affinity: "sessionAffinity",
        load_balancer_ip: "loadBalancerIP",
        load_balancer_source_ranges: "loadBalancerSourceRanges",
        external_name: "externalName",
        external_traffic_policy: "externalTrafficPolicy",
        health_check_node_port: "healthCheckNodePort",
        publish_not_ready_addresses: "publishNotReadyAddresses",
        session_affinity_config: "sessionAffinityConfig",
        ip_families: "ipFamilies",
        ip_family_policy: "ipFamilyPolicy",
        allocate_load_balancer_node_ports: "allocateLoadBalancerNodePorts",
        load_balancer_class: "loadBalancerClass",
        internal_traffic_policy: "internalTrafficPolicy",
        traffic_distribution: "trafficDistribution",
    }
    k8s_pb::api::core::v1::PortStatus {
        port: "port",
        protocol: "protocol",
        error: "error",
    }
    k8s_pb::api::core::v1::LoadBalancerIngress {
        ip: "ip",
        hostname: "hostname",
        ip_mode: "ipMode",
        ports: "ports",
    }
    k8s_pb::api::core::v1::LoadBalancerStatus {
        ingress: "ingress",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::Condition {
        r#type: "type",
        status: "status",
        observed_generation: "observedGeneration",
        last_transition_time: "lastTransitionTime",
        reason: "reason",
        message: "message",
    }
    k8s_pb::api::core::v1::ServiceStatus {
        load_balancer: "loadBalancer",
        conditions: "conditions",
    }
    k8s_pb::api::core::v1::Service {
        metadata: "metadata",
        spec: "spec",
        status: "status",
    }
    k8s_pb::api::core::v1::ServiceList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::core::v1::EventSource {
        component: "component",
        host: "host",
    }
    k8s_pb::api::core::v1::EventSeries {
        count: "count",
        last_observed_time: "lastObservedTime",
    }
    k8s_pb::api::core::v1::Event {
        metadata: "metadata",
        involved_object: "involvedObject",
        reason: "reason",
        message: "message",
        source: "source",
        first_timestamp: "firstTimestamp",
        last_timestamp: "lastTimestamp",
        count: "count",
        r#type: "type",
        event_time: "eventTime",
        series: "series",
        action: "action",
        related: "related",
        reporting_component: "reportingComponent",
        reporting_instance: "reportingInstance",
    }
    k8s_pb::api::core::v1::EventList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
        key: "key",
        operator: "operator",
        values: "values",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::LabelSelector {
        match_labels: "matchLabels",
        match_expressions: "matchExpressions",
    }
    k8s_pb::api::core::v1::HostPathVolumeSource {
        path: "path",
        r#type: "type",
    }
    k8s_pb::api::core::v1::EmptyDirVolumeSource {
        medium: "medium",
        size_limit: "sizeLimit",
    }
    k8s_pb::api::core::v1::GcePersistentDiskVolumeSource {
        pd_name: "pdName",
        fs_type: "fsType",
        partition: "partition",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::AwsElasticBlockStoreVolumeSource {
        volume_id: "volumeID",
        fs_type: "fsType",
        partition: "partition",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::GitRepoVolumeSource {
        repository: "repository",
        revision: "revision",
        directory: "directory",
    }
    k8s_pb::api::core::v1::KeyToPath {
        key: "key",
        path: "path",
        mode: "mode",
    }
    k8s_pb::api::core::v1::SecretVolumeSource {
        secret_name: "secretName",
        items: "items",
        default_mode: "defaultMode",
        optional: "optional",
    }
    k8s_pb::api::core::v1::NfsVolumeSource {
        server: "server",
        path: "path",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::IscsiVolumeSource {
        target_portal: "targetPortal",
        iqn: "iqn",
        lun: "lun",
        iscsi_interface: "iscsiInterface",
        fs_type: "fsType",
        read_only: "readOnly",
        portals: "portals",
        chap_auth_discovery: "chapAuthDiscovery",
        chap_auth_session: "chapAuthSession",
        secret_ref: "secretRef",
        initiator_name: "initiatorName",
    }
    k8s_pb::api::core::v1::GlusterfsVolumeSource {
        endpoints: "endpoints",
        path: "path",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::PersistentVolumeClaimVolumeSource {
        claim_name: "claimName",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::RbdVolumeSource {
        monitors: "monitors",
        image: "image",
        fs_type: "fsType",
        pool: "pool",
        user: "user",
        keyring: "keyring",
        secret_ref: "secretRef",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::FlexVolumeSource {
        driver: "driver",
        fs_type: "fsType",
        secret_ref: "secretRef",
        read_only: "readOnly",
        options: "options",
    }
    k8s_pb::api::core::v1::CinderVolumeSource {
        volume_id: "volumeID",
        fs_type: "fsType",
        read_only: "readOnly",
        secret_ref: "secretRef",
    }
    k8s_pb::api::core::v1::CephFsVolumeSource {
        monitors: "monitors",
        path: "path",
        user: "user",
        secret_file: "secretFile",
        secret_ref: "secretRef",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::FlockerVolumeSource {
        dataset_name: "datasetName",
        dataset_uuid: "datasetUUID",
    }
    k8s_pb::api::core::v1::ObjectFieldSelector {
        api_version: "apiVersion",
        field_path: "fieldPath",
    }
    k8s_pb::api::core::v1::ResourceFieldSelector {
        container_name: "containerName",
        resource: "resource",
        divisor: "divisor",
    }
    k8s_pb::api::core::v1::DownwardAPIVolumeFile {
        path: "path",
        field_ref: "fieldRef",
        resource_field_ref: "resourceFieldRef",
        mode: "mode",
    }
    k8s_pb::api::core::v1::DownwardAPIVolumeSource {
        items: "items",
        default_mode: "defaultMode",
    }
    k8s_pb::api::core::v1::FcVolumeSource {
        target_ww_ns: "targetWWNs",
        lun: "lun",
        fs_type: "fsType",
        read_only: "readOnly",
        wwids: "wwids",
    }
    k8s_pb::api::core::v1::AzureFileVolumeSource {
        secret_name: "secretName",
        share_name: "shareName",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::ConfigMapVolumeSource {
        local_object_reference: "" as inline,
        items: "items",
        default_mode: "defaultMode",
        optional: "optional",
    }
    k8s_pb::api::core::v1::VsphereVirtualDiskVolumeSource {
        volume_path: "volumePath",
        fs_type: "fsType",
        storage_policy_name: "storagePolicyName",
        storage_policy_id: "storagePolicyID",
    }
    k8s_pb::api::core::v1::QuobyteVolumeSource {
        registry: "registry",
        volume: "volume",
        read_only: "readOnly",
        user: "user",
        group: "group",
        tenant: "tenant",
    }
    k8s_pb::api::core::v1::AzureDiskVolumeSource {
        disk_name: "diskName",
        disk_uri: "diskURI",
        caching_mode: "cachingMode",
        fs_type: "fsType",
        read_only: "readOnly",
        kind: "kind",
    }
    k8s_pb::api::core::v1::PhotonPersistentDiskVolumeSource {
        pd_id: "pdID",
        fs_type: "fsType",
    }
    k8s_pb::api::core::v1::SecretProjection {
        local_object_reference: "" as inline,
        items: "items",
        optional: "optional",
    }
    k8s_pb::api::core::v1::DownwardAPIProjection {
        items: "items",
    }
    k8s_pb::api::core::v1::ConfigMapProjection {
        local_object_reference: "" as inline,
        items: "items",
        optional: "optional",
    }
    k8s_pb::api::core::v1::ServiceAccountTokenProjection {
        audience: "audience",
        expiration_seconds: "expirationSeconds",
        path: "path",
    }
    k8s_pb::api::core::v1::ClusterTrustBundleProjection {
        name: "name",
        signer_name: "signerName",
        label_selector: "labelSelector",
        optional: "optional",
        path: "path",
    }
    k8s_pb::api::core::v1::PodCertificateProjection {
        signer_name: "signerName",
        key_type: "keyType",
        max_expiration_seconds: "maxExpirationSeconds",
        credential_bundle_path: "credentialBundlePath",
        key_path: "keyPath",
        certificate_chain_path: "certificateChainPath",
        user_annotations: "userAnnotations",
    }
    k8s_pb::api::core::v1::VolumeProjection {
        secret: "secret",
        downward_api: "downwardAPI",
        config_map: "configMap",
        service_account_token: "serviceAccountToken",
        cluster_trust_bundle: "clusterTrustBundle",
        pod_certificate: "podCertificate",
    }
    k8s_pb::api::core::v1::ProjectedVolumeSource {
        sources: "sources",
        default_mode: "defaultMode",
    }
    k8s_pb::api::core::v1::PortworxVolumeSource {
        volume_id: "volumeID",
        fs_type: "fsType",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::ScaleIoVolumeSource {
        gateway: "gateway",
        system: "system",
        secret_ref: "secretRef",
        ssl_enabled: "sslEnabled",
        protection_domain: "protectionDomain",
        storage_pool: "storagePool",
        storage_mode: "storageMode",
        volume_name: "volumeName",
        fs_type: "fsType",
        read_only: "readOnly",
    }
    k8s_pb::api::core::v1::StorageOsVolumeSource {
        volume_name: "volumeName",
        volume_namespace: "volumeNamespace",
        fs_type: "fsType",
        read_only: "readOnly",
        secret_ref: "secretRef",
    }
    k8s_pb::api::core::v1::CSIVolumeSource {
        driver: "driver",
        read_only: "readOnly",
        fs_type: "fsType",
        volume_attributes: "volumeAttributes",
        node_publish_secret_ref: "nodePublishSecretRef",
    }
    k8s_pb::api::core::v1::VolumeResourceRequirements {
        limits: "limits",
        requests: "requests",
    }
    k8s_pb::api::core::v1::TypedLocalObjectReference {
        api_group: "apiGroup",
        kind: "kind",
        name: "name",
    }
    k8s_pb::api::core::v1::TypedObjectReference {
        api_group: "apiGroup",
        kind: "kind",
        name: "name",
        namespace: "namespace",
    }
    k8s_pb::api::core::v1::PersistentVolumeClaimSpec {
        access_modes: "accessModes",
        selector: "selector",
        resources: "resources",
        volume_name: "volumeName",
        storage_class_name: "storageClassName",
        volume_mode: "volumeMode",
        data_source: "dataSource",
        data_source_ref: "dataSourceRef",
        volume_attributes_class_name: "volumeAttributesClassName",
    }
    k8s_pb::api::core::v1::PersistentVolumeClaimTemplate {
        metadata: "metadata",
        spec: "spec",
    }
    k8s_pb::api::core::v1::EphemeralVolumeSource {
        volume_claim_template: "volumeClaimTemplate",
    }
    k8s_pb::api::core::v1::ImageVolumeSource {
        reference: "reference",
        pull_policy: "pullPolicy",
    }
    k8s_pb::api::core::v1::VolumeSource {
        host_path: "hostPath",
        empty_dir: "emptyDir",
        gce_persistent_disk: "gcePersistentDisk",
        aws_elastic_block_store: "awsElasticBlockStore",
        git_repo: "gitRepo",
        secret: "secret",
        nfs: "nfs",
        iscsi: "iscsi",
        glusterfs: "glusterfs",
        persistent_volume_claim: "persistentVolumeClaim",
        rbd: "rbd",
        flex_volume: "flexVolume",
        cinder: "cinder",
        cephfs: "cephfs",
        flocker: "flocker",
        downward_api: "downwardAPI",
        fc: "fc",
        azure_file: "azureFile",
        config_map: "configMap",
        vsphere_volume: "vsphereVolume",
        quobyte: "quobyte",
        azure_disk: "azureDisk",
        photon_persistent_disk: "photonPersistentDisk",
        projected: "projected",
        portworx_volume: "portworxVolume",
        scale_io: "scaleIO",
        storageos: "storageos",
        csi: "csi",
        ephemeral: "ephemeral",
        image: "image",
    }
    k8s_pb::api::core::v1::Volume {
        name: "name",
        volume_source: "" as inline,
    }
    k8s_pb::api::core::v1::ContainerPort {
        name: "name",
        host_port: "hostPort",
        container_port: "containerPort",
        protocol: "protocol",
        host_ip: "hostIP",
    }
    k8s_pb::api::core::v1::ConfigMapEnvSource {
        local_object_reference: "" as inline,
        optional: "optional",
    }
    k8s_pb::api::core::v1::SecretEnvSource {
        local_object_reference: "" as inline,
        optional: "optional",
    }
    k8s_pb::api::core::v1::EnvFromSource {
        prefix: "prefix",
        config_map_ref: "configMapRef",
        secret_ref: "secretRef",
    }
    k8s_pb::api::core::v1::ConfigMapKeySelector {
        local_object_reference: "" as inline,
        key: "key",
        optional: "optional",
    }
    k8s_pb::api::core::v1::SecretKeySelector {
        local_object_reference: "" as inline,
        key: "key",
        optional: "optional",
    }
    k8s_pb::api::core::v1::FileKeySelector {
        volume_name: "volumeName",
        path: "path",
        key: "key",
        optional: "optional",
    }
    k8s_pb::api::core::v1::EnvVarSource {
        field_ref: "fieldRef",
        resource_field_ref: "resourceFieldRef",
        config_map_key_ref: "configMapKeyRef",
        secret_key_ref: "secretKeyRef",
        file_key_ref: "fileKeyRef",
    }
    k8s_pb::api::core::v1::EnvVar {
        name: "name",
        value: "value",
        value_from: "valueFrom",
    }
    k8s_pb::api::core::v1::ResourceClaim {
        name: "name",
        request: "request",
    }
    k8s_pb::api::core::v1::ResourceRequirements {
        limits: "limits",
        requests: "requests",
        claims: "claims",
    }
    k8s_pb::api::core::v1::ContainerResizePolicy {
        resource_name: "resourceName",
        restart_policy: "restartPolicy",
    }
    k8s_pb::api::core::v1::ContainerRestartRuleOnExitCodes {
        operator: "operator",
        values: "values",
    }
    k8s_pb::api::core::v1::ContainerRestartRule {
        action: "action",
        exit_codes: "exitCodes",
    }
    k8s_pb::api::core::v1::VolumeMount {
        name: "name",
        read_only: "readOnly",
        recursive_read_only: "recursiveReadOnly",
        mount_path: "mountPath",
        sub_path: "subPath",
        mount_propagation: "mountPropagation",
        sub_path_expr: "subPathExpr",
    }
    k8s_pb::api::core::v1::VolumeDevice {
        name: "name",
        device_path: "devicePath",
    }
    k8s_pb::api::core::v1::ExecAction {
        command: "command",
    }
    k8s_pb::api::core::v1::HttpHeader {
        name: "name",
        value: "value",
    }
    k8s_pb::api::core::v1::HttpGetAction {
        path: "path",
        port: "port",
        host: "host",
        scheme: "scheme",
        http_headers: "httpHeaders",
    }
    k8s_pb::api::core::v1::TcpSocketAction {
        port: "port",
        host: "host",
    }
    k8s_pb::api::core::v1::GrpcAction {
        port: "port",
        service: "service",
    }
    k8s_pb::api::core::v1::ProbeHandler {
        exec: "exec",
        http_get: "httpGet",
        tcp_socket: "tcpSocket",
        grpc: "grpc",
    }
    k8s_pb::api::core::v1::Probe {
        handler: "" as inline,
        initial_delay_seconds: "initialDelaySeconds",
        timeout_seconds: "timeoutSeconds",
        period_seconds: "periodSeconds",
        success_threshold: "successThreshold",
        failure_threshold: "failureThreshold",
        termination_grace_period_seconds: "terminationGracePeriodSeconds",
    }
    k8s_pb::api::core::v1::SleepAction {
        seconds: "seconds",
    }
    k8s_pb::api::core::v1::LifecycleHandler {
        exec: "exec",
        http_get: "httpGet",
        tcp_socket: "tcpSocket",
        sleep: "sleep",
    }
    k8s_pb::api::core::v1::Lifecycle {
        post_start: "postStart",
        pre_stop: "preStop",
        stop_signal: "stopSignal",
    }
    k8s_pb::api::core::v1::Capabilities {
        add: "add",
        drop: "drop",
    }
    k8s_pb::api::core::v1::SeLinuxOptions {
        user: "user",
        role: "role",
        r#type: "type",
        level: "level",
    }
    k8s_pb::api::core::v1::WindowsSecurityContextOptions {
        gmsa_credential_spec_name: "gmsaCredentialSpecName",
        gmsa_credential_spec: "gmsaCredentialSpec",
        run_as_user_name: "runAsUserName",
        host_process: "hostProcess",
    }
    k8s_pb::api::core::v1::SeccompProfile {
        r#type: "type",
        localhost_profile: "localhostProfile",
    }
    k8s_pb::api::core::v1::AppArmorProfile {
        r#type: "type",
        localhost_profile: "localhostProfile",
    }
    k8s_pb::api::core::v1::SecurityContext {
        capabilities: "capabilities",
        privileged: "privileged",
        se_linux_options: "seLinuxOptions",
        windows_options: "windowsOptions",
        run_as_user: "runAsUser",
        run_as_group: "runAsGroup",
        run_as_non_root: "runAsNonRoot",
        read_only_root_filesystem: "readOnlyRootFilesystem",
        allow_privilege_escalation: "allowPrivilegeEscalation",
        proc_mount: "procMount",
        seccomp_profile: "seccompProfile",
        app_armor_profile: "appArmorProfile",
    }
    k8s_pb::api::core::v1::Container {
        name: "name",
        image: "image",
        command: "command",
        args: "args",
        working_dir: "workingDir",
        ports: "ports",
        env_from: "envFrom",
        env: "env",
        resources: "resources",
        resize_policy: "resizePolicy",
        restart_policy: "restartPolicy",
        restart_policy_rules: "restartPolicyRules",
        volume_mounts: "volumeMounts",
        volume_devices: "volumeDevices",
        liveness_probe: "livenessProbe",
        readiness_probe: "readinessProbe",
        startup_probe: "startupProbe",
        lifecycle: "lifecycle",
        termination_message_path: "terminationMessagePath",
        termination_message_policy: "terminationMessagePolicy",
        image_pull_policy: "imagePullPolicy",
        security_context: "securityContext",
        stdin: "stdin",
        stdin_once: "stdinOnce",
        tty: "tty",
    }
    k8s_pb::api::core::v1::EphemeralContainerCommon {
        name: "name",
        image: "image",
        command: "command",
        args: "args",
        working_dir: "workingDir",
        ports: "ports",
        env_from: "envFrom",
        env: "env",
        resources: "resources",
        resize_policy: "resizePolicy",
        restart_policy: "restartPolicy",
        restart_policy_rules: "restartPolicyRules",
        volume_mounts: "volumeMounts",
        volume_devices: "volumeDevices",
        liveness_probe: "livenessProbe",
        readiness_probe: "readinessProbe",
        startup_probe: "startupProbe",
        lifecycle: "lifecycle",
        termination_message_path: "terminationMessagePath",
        termination_message_policy: "terminationMessagePolicy",
        image_pull_policy: "imagePullPolicy",
        security_context: "securityContext",
        stdin: "stdin",
        stdin_once: "stdinOnce",
        tty: "tty",
    }
    k8s_pb::api::core::v1::EphemeralContainer {
        ephemeral_container_common: "" as inline,
        target_container_name: "targetContainerName",
    }
    k8s_pb::api::core::v1::Sysctl {
        name: "name",
        value: "value",
    }
    k8s_pb::api::core::v1::PodSecurityContext {
        se_linux_options: "seLinuxOptions",
        windows_options: "windowsOptions",
        run_as_user: "runAsUser",
        run_as_group: "runAsGroup",
        run_as_non_root: "runAsNonRoot",
        supplemental_groups: "supplementalGroups",
        supplemental_groups_policy: "supplementalGroupsPolicy",
        fs_group: "fsGroup",
        sysctls: "sysctls",
        fs_group_change_policy: "fsGroupChangePolicy",
        seccomp_profile: "seccompProfile",
        app_armor_profile: "appArmorProfile",
        se_linux_change_policy: "seLinuxChangePolicy",
    }
    k8s_pb::api::core::v1::NodeSelectorRequirement {
        key: "key",
        operator: "operator",
        values: "values",
    }
    k8s_pb::api::core::v1::NodeSelectorTerm {
        match_expressions: "matchExpressions",
        match_fields: "matchFields",
    }
    k8s_pb::api::core::v1::NodeSelector {
        node_selector_terms: "nodeSelectorTerms",
    }
    k8s_pb::api::core::v1::PreferredSchedulingTerm {
        weight: "weight",
        preference: "preference",
    }
    k8s_pb::api::core::v1::NodeAffinity {
        required_during_scheduling_ignored_during_execution: "requiredDuringSchedulingIgnoredDuringExecution",
        preferred_during_scheduling_ignored_during_execution: "preferredDuringSchedulingIgnoredDuringExecution",
    }
    k8s_pb::api::core::v1::PodAffinityTerm {
        label_selector: "labelSelector",
        namespaces: "namespaces",
        topology_key: "topologyKey",
        namespace_selector: "namespaceSelector",
        match_label_keys: "matchLabelKeys",
        mismatch_label_keys: "mismatchLabelKeys",
    }
    k8s_pb::api::core::v1::WeightedPodAffinityTerm {
        weight: "weight",
        pod_affinity_term: "podAffinityTerm",
    }
    k8s_pb::api::core::v1::PodAffinity {
        required_during_scheduling_ignored_during_execution: "requiredDuringSchedulingIgnoredDuringExecution",
        preferred_during_scheduling_ignored_during_execution: "preferredDuringSchedulingIgnoredDuringExecution",
    }
    k8s_pb::api::core::v1::PodAntiAffinity {
        required_during_scheduling_ignored_during_execution: "requiredDuringSchedulingIgnoredDuringExecution",
        preferred_during_scheduling_ignored_during_execution: "preferredDuringSchedulingIgnoredDuringExecution",
    }
    k8s_pb::api::core::v1::Affinity {
        node_affinity: "nodeAffinity",
        pod_affinity: "podAffinity",
        pod_anti_affinity: "podAntiAffinity",
    }
    k8s_pb::api::core::v1::Toleration {
        key: "key",
        operator: "operator",
        value: "value",
        effect: "effect",
        toleration_seconds: "tolerationSeconds",
    }
    k8s_pb::api::core::v1::HostAlias {
        ip: "ip",
        hostnames: "hostnames",
    }
    k8s_pb::api::core::v1::PodDnsConfigOption {
        name: "name",
        value: "value",
    }
    k8s_pb::api::core::v1::PodDnsConfig {
        nameservers: "nameservers",
        searches: "searches",
        options: "options",
    }
    k8s_pb::api::core::v1::PodReadinessGate {
        condition_type: "conditionType",
    }
    k8s_pb::api::core::v1::TopologySpreadConstraint {
        max_skew: "maxSkew",
        topology_key: "topologyKey",
        when_unsatisfiable: "whenUnsatisfiable",
        label_selector: "labelSelector",
        min_domains: "minDomains",
        node_affinity_policy: "nodeAffinityPolicy",
        node_taints_policy: "nodeTaintsPolicy",
        match_label_keys: "matchLabelKeys",
    }
    k8s_pb::api::core::v1::PodOs {
        name: "name",
    }
    k8s_pb::api::core::v1::PodSchedulingGate {
        name: "name",
    }
    k8s_pb::api::core::v1::PodResourceClaim {
        name: "name",
        resource_claim_name: "resourceClaimName",
        resource_claim_template_name: "resourceClaimTemplateName",
    }
    k8s_pb::api::core::v1::WorkloadReference {
        name: "name",
        pod_group: "podGroup",
        pod_group_replica_key: "podGroupReplicaKey",
    }
    k8s_pb::api::core::v1::PodSpec {
        volumes: "volumes",
        init_containers: "initContainers",
        containers: "containers",
        ephemeral_containers: "ephemeralContainers",
        restart_policy: "restartPolicy",
        termination_grace_period_seconds: "terminationGracePeriodSeconds",
        active_deadline_seconds: "activeDeadlineSeconds",
        dns_policy: "dnsPolicy",
        node_selector: "nodeSelector",
        service_account_name: "serviceAccountName",
        service_account: "serviceAccount",
        automount_service_account_token: "automountServiceAccountToken",
        node_name: "nodeName",
        host_network: "hostNetwork",
        host_pid: "hostPID",
        host_ipc: "hostIPC",
        share_process_namespace: "shareProcessNamespace",
        security_context: "securityContext",
        image_pull_secrets: "imagePullSecrets",
        hostname: "hostname",
        subdomain: "subdomain",
        affinity: "affinity",
        scheduler_name: "schedulerName",
        tolerations: "tolerations",
        host_aliases: "hostAliases",
        priority_class_name: "priorityClassName",
        priority: "priority",
        dns_config: "dnsConfig",
        readiness_gates: "readinessGates",
        runtime_class_name: "runtimeClassName",
        enable_service_links: "enableServiceLinks",
        preemption_policy: "preemptionPolicy",
        overhead: "overhead",
        topology_spread_constraints: "topologySpreadConstraints",
        set_hostname_as_fqdn: "setHostnameAsFQDN",
        os: "os",
        host_users: "hostUsers",
        scheduling_gates: "schedulingGates",
        resource_claims: "resourceClaims",
        resources: "resources",
        hostname_override: "hostnameOverride",
        workload_ref: "workloadRef",
    }
    k8s_pb::api::core::v1::PodTemplateSpec {
        metadata: "metadata",
        spec: "spec",
    }
    k8s_pb::api::apps::v1::RollingUpdateDeployment {
        max_unavailable: "maxUnavailable",
        max_surge: "maxSurge",
    }
    k8s_pb::api::apps::v1::DeploymentStrategy {
        r#type: "type",
        rolling_update: "rollingUpdate",
    }
    k8s_pb::api::apps::v1::DeploymentSpec {
        replicas: "replicas",
        selector: "selector",
        template: "template",
        strategy: "strategy",
        min_ready_seconds: "minReadySeconds",
        revision_history_limit: "revisionHistoryLimit",
        paused: "paused",
        progress_deadline_seconds: "progressDeadlineSeconds",
    }
    k8s_pb::api::apps::v1::DeploymentCondition {
        r#type: "type",
        status: "status",
        last_update_time: "lastUpdateTime",
        last_transition_time: "lastTransitionTime",
        reason: "reason",
        message: "message",
    }
    k8s_pb::api::apps::v1::DeploymentStatus {
        observed_generation: "observedGeneration",
        replicas: "replicas",
        updated_replicas: "updatedReplicas",
        ready_replicas: "readyReplicas",
        available_replicas: "availableReplicas",
        unavailable_replicas: "unavailableReplicas",
        terminating_replicas: "terminatingReplicas",
        conditions: "conditions",
        collision_count: "collisionCount",
    }
    k8s_pb::api::apps::v1::Deployment {
        metadata: "metadata",
        spec: "spec",
        status: "status",
    }
    k8s_pb::api::apps::v1::DeploymentList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::batch::v1::PodFailurePolicyOnExitCodesRequirement {
        container_name: "containerName",
        operator: "operator",
        values: "values",
    }
    k8s_pb::api::batch::v1::PodFailurePolicyOnPodConditionsPattern {
        r#type: "type",
        status: "status",
    }
    k8s_pb::api::batch::v1::PodFailurePolicyRule {
        action: "action",
        on_exit_codes: "onExitCodes",
        on_pod_conditions: "onPodConditions",
    }
    k8s_pb::api::batch::v1::PodFailurePolicy {
        rules: "rules",
    }
    k8s_pb::api::batch::v1::SuccessPolicyRule {
        succeeded_indexes: "succeededIndexes",
        succeeded_count: "succeededCount",
    }
    k8s_pb::api::batch::v1::SuccessPolicy {
        rules: "rules",
    }
    k8s_pb::api::batch::v1::JobSpec {
        parallelism: "parallelism",
        completions: "completions",
        active_deadline_seconds: "activeDeadlineSeconds",
        pod_failure_policy: "podFailurePolicy",
        success_policy: "successPolicy",
        backoff_limit: "backoffLimit",
        backoff_limit_per_index: "backoffLimitPerIndex",
        max_failed_indexes: "maxFailedIndexes",
        selector: "selector",
        manual_selector: "manualSelector",
        template: "template",
        ttl_seconds_after_finished: "ttlSecondsAfterFinished",
        completion_mode: "completionMode",
        suspend: "suspend",
        pod_replacement_policy: "podReplacementPolicy",
        managed_by: "managedBy",
    }
    k8s_pb::api::batch::v1::JobCondition {
        r#type: "type",
        status: "status",
        last_probe_time: "lastProbeTime",
        last_transition_time: "lastTransitionTime",
        reason: "reason",
        message: "message",
    }
    k8s_pb::api::batch::v1::UncountedTerminatedPods {
        succeeded: "succeeded",
        failed: "failed",
    }
    k8s_pb::api::batch::v1::JobStatus {
        conditions: "conditions",
        start_time: "startTime",
        completion_time: "completionTime",
        active: "active",
        succeeded: "succeeded",
        failed: "failed",
        terminating: "terminating",
        completed_indexes: "completedIndexes",
        failed_indexes: "failedIndexes",
        uncounted_terminated_pods: "uncountedTerminatedPods",
        ready: "ready",
    }
    k8s_pb::api::batch::v1::Job {
        metadata: "metadata",
        spec: "spec",
        status: "status",
    }
    k8s_pb::api::batch::v1::JobList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::rbac::v1::PolicyRule {
        verbs: "verbs",
        api_groups: "apiGroups",
        resources: "resources",
        resource_names: "resourceNames",
        non_resource_ur_ls: "nonResourceURLs",
    }
    k8s_pb::api::rbac::v1::Role {
        metadata: "metadata",
        rules: "rules",
    }
    k8s_pb::api::rbac::v1::RoleList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::rbac::v1::Subject {
        kind: "kind",
        api_group: "apiGroup",
        name: "name",
        namespace: "namespace",
    }
    k8s_pb::api::rbac::v1::RoleRef {
        api_group: "apiGroup",
        kind: "kind",
        name: "name",
    }
    k8s_pb::api::rbac::v1::RoleBinding {
        metadata: "metadata",
        subjects: "subjects",
        role_ref: "roleRef",
    }
    k8s_pb::api::rbac::v1::RoleBindingList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::rbac::v1::AggregationRule {
        cluster_role_selectors: "clusterRoleSelectors",
    }
    k8s_pb::api::rbac::v1::ClusterRole {
        metadata: "metadata",
        rules: "rules",
        aggregation_rule: "aggregationRule",
    }
    k8s_pb::api::rbac::v1::ClusterRoleList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::rbac::v1::ClusterRoleBinding {
        metadata: "metadata",
        subjects: "subjects",
        role_ref: "roleRef",
    }
    k8s_pb::api::rbac::v1::ClusterRoleBindingList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::policy::v1::PodDisruptionBudgetSpec {
        min_available: "minAvailable",
        selector: "selector",
        max_unavailable: "maxUnavailable",
        unhealthy_pod_eviction_policy: "unhealthyPodEvictionPolicy",
    }
    k8s_pb::api::policy::v1::PodDisruptionBudgetStatus {
        observed_generation: "observedGeneration",
        disrupted_pods: "disruptedPods",
        disruptions_allowed: "disruptionsAllowed",
        current_healthy: "currentHealthy",
        desired_healthy: "desiredHealthy",
        expected_pods: "expectedPods",
        conditions: "conditions",
    }
    k8s_pb::api::policy::v1::PodDisruptionBudget {
        metadata: "metadata",
        spec: "spec",
        status: "status",
    }
    k8s_pb::api::policy::v1::PodDisruptionBudgetList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::networking::v1::NetworkPolicyPort {
        protocol: "protocol",
        port: "port",
        end_port: "endPort",
    }
    k8s_pb::api::networking::v1::IpBlock {
        cidr: "cidr",
        except: "except",
    }
    k8s_pb::api::networking::v1::NetworkPolicyPeer {
        pod_selector: "podSelector",
        namespace_selector: "namespaceSelector",
        ip_block: "ipBlock",
    }
    k8s_pb::api::networking::v1::NetworkPolicyIngressRule {
        ports: "ports",
        from: "from",
    }
    k8s_pb::api::networking::v1::NetworkPolicyEgressRule {
        ports: "ports",
        to: "to",
    }
    k8s_pb::api::networking::v1::NetworkPolicySpec {
        pod_selector: "podSelector",
        ingress: "ingress",
        egress: "egress",
        policy_types: "policyTypes",
    }
    k8s_pb::api::networking::v1::NetworkPolicy {
        metadata: "metadata",
        spec: "spec",
    }
    k8s_pb::api::networking::v1::NetworkPolicyList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::coordination::v1::LeaseSpec {
        holder_identity: "holderIdentity",
        lease_duration_seconds: "leaseDurationSeconds",
        acquire_time: "acquireTime",
        renew_time: "renewTime",
        lease_transitions: "leaseTransitions",
        strategy: "strategy",
        preferred_holder: "preferredHolder",
    }
    k8s_pb::api::coordination::v1::Lease {
        metadata: "metadata",
        spec: "spec",
    }
    k8s_pb::api::coordination::v1::LeaseList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::api::events::v1::EventSeries {
        count: "count",
        last_observed_time: "lastObservedTime",
    }
    k8s_pb::api::events::v1::Event {
        metadata: "metadata",
        event_time: "eventTime",
        series: "series",
        reporting_controller: "reportingController",
        reporting_instance: "reportingInstance",
        action: "action",
        reason: "reason",
        regarding: "regarding",
        related: "related",
        note: "note",
        r#type: "type",
        deprecated_source: "deprecatedSource",
        deprecated_first_timestamp: "deprecatedFirstTimestamp",
        deprecated_last_timestamp: "deprecatedLastTimestamp",
        deprecated_count: "deprecatedCount",
    }
    k8s_pb::api::events::v1::EventList {
        metadata: "metadata",
        items: "items",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::StatusCause {
        reason: "reason",
        message: "message",
        field: "field",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::StatusDetails {
        name: "name",
        group: "group",
        kind: "kind",
        uid: "uid",
        causes: "causes",
        retry_after_seconds: "retryAfterSeconds",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::Status {
        metadata: "metadata",
        status: "status",
        message: "message",
        reason: "reason",
        details: "details",
        code: "code",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::Preconditions {
        uid: "uid",
        resource_version: "resourceVersion",
    }
    k8s_pb::apimachinery::pkg::apis::meta::v1::DeleteOptions {
        grace_period_seconds: "gracePeriodSeconds",
        preconditions: "preconditions",
        orphan_dependents: "orphanDependents",
        propagation_policy: "propagationPolicy",
        dry_run: "dryRun",
        ignore_store_read_error_with_cluster_breaking_potential: "ignoreStoreReadErrorWithClusterBreakingPotential",
    }
    k8s_pb::api::core::v1::PodCondition {
        r#type: "type",
        observed_generation: "observedGeneration",
        status: "status",
        last_probe_time: "lastProbeTime",
        last_transition_time: "lastTransitionTime",
        reason: "reason",
        message: "message",
    }
    k8s_pb::api::core::v1::HostIp {
        ip: "ip",
    }
    k8s_pb::api::core::v1::PodIp {
        ip: "ip",
    }
    k8s_pb::api::core::v1::ContainerStateWaiting {
        reason: "reason",
        message: "message",
    }
    k8s_pb::api::core::v1::ContainerStateRunning {
        started_at: "startedAt",
    }
    k8s_pb::api::core::v1::ContainerStateTerminated {
        exit_code: "exitCode",
        signal: "signal",
        reason: "reason",
        message: "message",
        started_at: "startedAt",
        finished_at: "finishedAt",
        container_id: "containerID",
    }
    k8s_pb::api::core::v1::ContainerState {
        waiting: "waiting",
        running: "running",
        terminated: "terminated",
    }
    k8s_pb::api::core::v1::VolumeMountStatus {
        name: "name",
        mount_path: "mountPath",
        read_only: "readOnly",
        recursive_read_only: "recursiveReadOnly",
    }
    k8s_pb::api::core::v1::LinuxContainerUser {
        uid: "uid",
        gid: "gid",
        supplemental_groups: "supplementalGroups",
    }
    k8s_pb::api::core::v1::ContainerUser {
        linux: "linux",
    }
    k8s_pb::api::core::v1::ResourceHealth {
        resource_id: "resourceID",
        health: "health",
    }
    k8s_pb::api::core::v1::ResourceStatus {
        name: "name",
        resources: "resources",
    }
    k8s_pb::api::core::v1::ContainerStatus {
        name: "name",
        state: "state",
        last_state: "lastState",
        ready: "ready",
        restart_count: "restartCount",
        image: "image",
        image_id: "imageID",
        container_id: "containerID",
        started: "started",
        allocated_resources: "allocatedResources",
        resources: "resources",
        volume_mounts: "volumeMounts",
        user: "user",
        allocated_resources_status: "allocatedResourcesStatus",
        stop_signal: "stopSignal",
    }
    k8s_pb::api::core::v1::PodResourceClaimStatus {
        name: "name",
        resource_claim_name: "resourceClaimName",
    }
    k8s_pb::api::core::v1::ContainerExtendedResourceRequest {
        container_name: "containerName",
        resource_name: "resourceName",
        request_name: "requestName",
    }
    k8s_pb::api::core::v1::PodExtendedResourceClaimStatus {
        request_mappings: "requestMappings",
        resource_claim_name: "resourceClaimName",
    }
    k8s_pb::api::core::v1::PodStatus {
        observed_generation: "observedGeneration",
        phase: "phase",
        conditions: "conditions",
        message: "message",
        reason: "reason",
        nominated_node_name: "nominatedNodeName",
        host_ip: "hostIP",
        host_ips: "hostIPs",
        pod_ip: "podIP",
        pod_ips: "podIPs",
        start_time: "startTime",
        init_container_statuses: "initContainerStatuses",
        container_statuses: "containerStatuses",
        qos_class: "qosClass",
        ephemeral_container_statuses: "ephemeralContainerStatuses",
        resize: "resize",
        resource_claim_statuses: "resourceClaimStatuses",
        extended_resource_claim_status: "extendedResourceClaimStatus",
        allocated_resources: "allocatedResources",
        resources: "resources",
    }
    k8s_pb::api::core::v1::Pod {
        metadata: "metadata",
        spec: "spec",
        status: "status",
    }
    k8s_pb::api::core::v1::PodList {
        metadata: "metadata",
        items: "items",
    }
}
