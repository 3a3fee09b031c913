module github.com/mlxserving/mlxserving

go 1.26
